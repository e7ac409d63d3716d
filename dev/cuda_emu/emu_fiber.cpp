/*
emu_fiber.cpp: the context switch and the pool of fiber stacks (see emu_fiber.h).
*/
#include "emu_fiber.h"
#include "emu_internal.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

// emu_fiber_switch(save_sp = %rdi, load_sp = %rsi): push the six callee-saved registers, swap
// stacks, pop the other fiber's six and return to where it switched away (or to its entry)
asm(R"(
    .text
    .globl emu_fiber_switch
    .type emu_fiber_switch, @function
emu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_fiber_switch, .-emu_fiber_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");

enum { SAVED_REGISTERS = 6, STACK_ALIGN = 16 };

emu_fiber_stack emu_fiber_stack_get(int i) {
    static std::vector<emu_fiber_stack> pool;
    while ((int)pool.size() <= i) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t total = EMU_FIBER_STACK_BYTES + page;
        void* m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) { emu_fail("mmap of a %zu-byte fiber stack failed", total); }
        if (mprotect(m, page, PROT_NONE) != 0) { emu_fail("mprotect of a fiber stack guard page failed"); }
        pool.push_back(emu_fiber_stack{(char*)m + page, (size_t)EMU_FIBER_STACK_BYTES});
    }
    return pool[i];
}

void* emu_fiber_prepare(emu_fiber_stack stack, void (*entry)()) {
    uintptr_t top = ((uintptr_t)(stack.base + stack.bytes)) & ~(uintptr_t)(STACK_ALIGN - 1);
    // from the top down: a zero "return address" for entry (it never returns), entry itself for
    // the switch's ret, and six zeroed registers for its pops. After ret, %rsp = top - 8, which is
    // what the ABI promises a function at its first instruction (16-byte aligned before the call).
    uintptr_t* sp = (uintptr_t*)top;
    *--sp = 0;
    *--sp = (uintptr_t)entry;
    for (int r = 0; r < SAVED_REGISTERS; r++) { *--sp = 0; }
    return sp;
}

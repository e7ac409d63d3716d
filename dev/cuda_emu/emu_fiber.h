/*
emu_fiber.h: fibers, the threads of an emulated block. A fiber is a stack and a saved stack
pointer; emu_fiber_switch() saves the callee-saved registers of the running code on its stack,
stores its stack pointer, loads the other one and returns into the other code. It costs a few
nanoseconds (swapcontext, which also saves the signal mask with a system call, is 20-35x slower).

    emu_fiber_stack s = emu_fiber_stack_get(i);        // stacks are mapped once and reused
    void* sp = emu_fiber_prepare(s, entry);            // entry() runs at the first switch to sp
    emu_fiber_switch(&scheduler_sp, sp);               // run it until it switches back

Invariants: x86-64 System V only; entry() must never return (it switches away for the last time);
the floating-point control state (MXCSR, x87) is shared by all fibers, kernels do not change it.
Every stack has an unmapped guard page below it, so an overflow is a segfault, not corruption.
*/
#ifndef CUDA_EMU_FIBER_H
#define CUDA_EMU_FIBER_H

#include <stddef.h>

#if !defined(__x86_64__)
#error "dev/cuda_emu: the fiber switch is written for x86-64 only"
#endif

enum { EMU_FIBER_STACK_BYTES = 256 * 1024 };  // per thread; kernels keep small arrays on the stack

struct emu_fiber_stack {
    char* base;    // lowest usable address
    size_t bytes;
};

extern "C" void emu_fiber_switch(void** save_sp, void* load_sp);
// the i-th stack of the pool (mapped on first use, kept for the rest of the program)
emu_fiber_stack emu_fiber_stack_get(int i);
// an initial stack pointer: the first switch to it calls entry() on that stack
void* emu_fiber_prepare(emu_fiber_stack stack, void (*entry)());

#endif // CUDA_EMU_FIBER_H

#!/usr/bin/env python3
"""
rewrite.py: turn a CUDA source into host C++ for the emulated device, keeping line numbers.

Usage: python3 dev/cuda_emu/rewrite.py INPUT.cu OUTPUT.cpp [-I DIR ...] [-MT TARGET]

Three rewrites, everything else is left alone:
  kernel<<<grid, block, smem, stream>>>(args)
      -> emu_launch(EMU_LAUNCH_SITE("kernel"), emu_launch_config(grid, block, smem, stream), EMU_KERNEL(kernel), args)
      (kernel may be a template: kernel<float, 4>, or with its arguments deduced from args)
  extern __shared__ T name[];
      -> T* name = (T*)emu_dynamic_shared();
  __shared__ T name[N];             (inside a function body)
      -> __shared__ T name[N]; emu_shared_touch(&name, sizeof(name));
         (the first thread of a block to pass the declaration fills it with NaN bytes)

Invariants:
  - the output has exactly the input's lines: a rewrite never adds or removes a newline, so
    compiler errors and the emulator's own messages point at the .cu (a #line directive names it);
  - comments and string literals are never rewritten (they are masked before matching);
  - OUTPUT.d lists every file read, as make prerequisites of TARGET (default: OUTPUT), each
    with an empty rule of its own (as gcc -MP does);
  - local includes (#include "x") are rewritten too, recursively, into OUTPUT's directory under
    includes/, because kernels usually live in headers (cuda/*.cuh); the #include line is pointed
    at the rewritten copy.
"""
import os
import re
import sys


def mask_comments_and_strings(text):
    """Same length as text; comments and string/char literals become spaces (newlines kept)."""
    out = list(text)
    i, n = 0, len(text)
    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))  # keep the quotes so the structure stays visible
            i = j + 1
        else:
            i += 1
    return "".join(out)


def kernel_expression_start(masked, end):
    """Start index of the kernel expression that ends just before `end` (before '<<<').
    Accepts identifiers, '::' and balanced template arguments: ns::kernel<float, 4>."""
    i = end
    while i > 0 and masked[i - 1].isspace():
        i -= 1
    while i > 0:
        c = masked[i - 1]
        if c.isalnum() or c == "_" or c == ":":
            i -= 1
        elif c == ">":
            depth = 0
            while i > 0:
                i -= 1
                if masked[i] == ">":
                    depth += 1
                elif masked[i] == "<":
                    depth -= 1
                    if depth == 0:
                        break
        else:
            break
    return i


LAUNCH_OPEN, LAUNCH_CLOSE = "<<<", ">>>"
EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+([^;\[\]]*?)\s*\b(\w+)\s*\[\s*\]\s*;")
# the type may carry an alignment, __align__(32) or alignas(32): the only parentheses allowed
STATIC_SHARED = re.compile(r"__shared__\s+((?:[^;{}()=]|(?:__align__|alignas)\s*\([^()]*\))*?)\b(\w+)\s*((?:\[[^\];]*\]\s*)*);")
ALIGN = re.compile(r"__align__\s*\([^)]*\)")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def find_launches(masked):
    """Yield (start, end, replacement) for every kernel launch."""
    pos = 0
    while True:
        open_at = masked.find(LAUNCH_OPEN, pos)
        if open_at < 0:
            return
        close_at = masked.find(LAUNCH_CLOSE, open_at)
        if close_at < 0:
            sys.exit(f"rewrite.py: '<<<' without '>>>' at offset {open_at}")
        paren = close_at + len(LAUNCH_CLOSE)
        while paren < len(masked) and masked[paren].isspace():
            paren += 1
        if paren >= len(masked) or masked[paren] != "(":
            sys.exit(f"rewrite.py: kernel launch without '(' after '>>>' at offset {close_at}")
        start = kernel_expression_start(masked, open_at)
        yield start, open_at, close_at, paren
        pos = paren + 1


def rewrite_text(text):
    masked = mask_comments_and_strings(text)
    edits = []  # (start, end, replacement); applied from the end so offsets stay valid

    for start, open_at, close_at, paren in find_launches(masked):
        kernel = " ".join(text[start:open_at].split())
        config = text[open_at + len(LAUNCH_OPEN):close_at]
        after = paren + 1
        while after < len(masked) and masked[after].isspace():
            after += 1
        no_args = after < len(masked) and masked[after] == ")"
        span = text[start:paren + 1]
        replacement = (f'emu_launch(EMU_LAUNCH_SITE("{kernel}"), emu_launch_config({" ".join(config.split())}), '
                       f'EMU_KERNEL({kernel}){"" if no_args else ", "}')
        edits.append((start, paren + 1, replacement + "\n" * span.count("\n")))

    for m in EXTERN_SHARED.finditer(masked):
        type_ = ALIGN.sub("", text[m.start(1):m.end(1)]).strip()
        name = m.group(2)
        span = text[m.start():m.end()]
        replacement = f"{type_}* {name} = ({type_}*)emu_dynamic_shared();"
        edits.append((m.start(), m.end(), replacement + "\n" * span.count("\n")))

    for m in STATIC_SHARED.finditer(masked):
        if masked[max(0, m.start() - 20):m.start()].rstrip().endswith("extern"):
            continue
        depth = masked.count("{", 0, m.start()) - masked.count("}", 0, m.start())
        if depth <= 0:
            continue  # file scope: a plain static, not refilled per block (see README)
        name = m.group(2)
        edits.append((m.end(), m.end(), f" emu_shared_touch(&{name}, sizeof({name}));"))

    edits.sort(key=lambda e: e[0], reverse=True)
    for start, end, replacement in edits:
        text = text[:start] + replacement + text[end:]
    return text


def include_copy_path(inc_root, src):
    """Where the rewritten copy of the included file src goes: under inc_root, at src's path
    from the working directory (so "llmc/x.h" and "../llmc/x.h" name one copy, and a copy's own
    relative includes resolve against the original's directory, never the copy's)."""
    rel = os.path.relpath(src)
    return os.path.join(inc_root, rel.replace("..", "__up__"))


def rewrite_file(src, dst, include_dirs, done, inc_root):
    """Rewrite src into dst, and every local include it names, recursively."""
    src = os.path.abspath(src)
    if src in done:
        return
    done[src] = dst
    with open(src) as f:
        text = f.read()
    text = rewrite_text(text)

    def redirect(m):
        name = m.group(1)
        for d in [os.path.dirname(src)] + include_dirs:
            cand = os.path.abspath(os.path.join(d, name))
            if os.path.isfile(cand):
                sub_dst = done.get(cand) or include_copy_path(inc_root, cand)
                rewrite_file(cand, sub_dst, include_dirs, done, inc_root)
                return m.group(0).replace(f'"{name}"', f'"{os.path.abspath(done[cand])}"')
        return m.group(0)  # not found locally: leave it to the compiler

    text = INCLUDE.sub(redirect, text)
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    with open(dst, "w") as f:
        f.write(f'#line 1 "{os.path.relpath(src)}"\n' + text)


def main():
    args = sys.argv[1:]
    include_dirs = []
    files = []
    target = None
    while args:
        a = args.pop(0)
        if a == "-MT":
            target = args.pop(0)
        elif a == "-I":
            include_dirs.append(os.path.abspath(args.pop(0)))
        elif a.startswith("-I"):
            include_dirs.append(os.path.abspath(a[2:]))
        else:
            files.append(a)
    if len(files) != 2:
        sys.exit(__doc__)
    done = {}
    rewrite_file(files[0], files[1], include_dirs, done, os.path.join(os.path.dirname(files[1]), "includes"))
    # a make dependency file: the output is stale when any source it was rewritten from changes;
    # each source also gets an empty rule (as gcc -MP), so a header that was moved or deleted
    # makes the program rebuild instead of stopping make with "no rule to make target"
    with open(files[1] + ".d", "w") as f:
        f.write(f"{target or files[1]}: " + " ".join(sorted(done)) + "\n")
        for source in sorted(done):
            f.write(f"{source}:\n")


if __name__ == "__main__":
    main()

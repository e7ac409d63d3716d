#!/usr/bin/env bash
# find_nccl.sh: where NCCL's header and library are, as nvcc flags. emu.mk (emu-nvcc-check,
# gpu-check) uses it, so every real-CUDA build finds NCCL the same way.
#
#   bash dev/cuda_emu/find_nccl.sh --cflags   -I flag for nccl.h (empty when it is in /usr/include)
#   bash dev/cuda_emu/find_nccl.sh --libs     -L/-l flags, with an rpath outside the system folders
#   bash dev/cuda_emu/find_nccl.sh --where    one line saying which NCCL was found
#
# Looks, in order, in: $NCCL_HOME (include/ and lib/), the CUDA toolkit ($CUDA_HOME, default
# /usr/local/cuda: include/, lib64/ or lib/), the system package (/usr/include/nccl.h and libnccl.so
# in the linker's folders), and the nvidia-nccl Python package (include/ and lib/libnccl.so.2 with
# no libnccl.so link, hence -l:libnccl.so.2). Exits 1 with a message on stderr when none has it.
set -u
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
SYSTEM_LIB_DIRS=(/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /lib/x86_64-linux-gnu)

# the folder holding libnccl.so or libnccl.so.2 among the arguments, or nothing
lib_dir_in() {
    local dir
    for dir in "$@"; do
        if [ -e "$dir/libnccl.so" ] || [ -e "$dir/libnccl.so.2" ]; then echo "$dir"; return; fi
    done
}

# sets INCLUDE_DIR, LIB_DIR and WHERE from the first place that has both header and library
find_nccl() {
    local python_dir
    if [ -n "${NCCL_HOME:-}" ] && [ -e "$NCCL_HOME/include/nccl.h" ]; then
        INCLUDE_DIR=$NCCL_HOME/include; LIB_DIR=$(lib_dir_in "$NCCL_HOME/lib" "$NCCL_HOME/lib64")
        WHERE="NCCL_HOME ($NCCL_HOME)"
        [ -n "$LIB_DIR" ] && return 0
    fi
    if [ -e "$CUDA_HOME/include/nccl.h" ]; then
        INCLUDE_DIR=$CUDA_HOME/include; LIB_DIR=$(lib_dir_in "$CUDA_HOME/lib64" "$CUDA_HOME/lib")
        WHERE="the CUDA toolkit ($CUDA_HOME)"
        [ -n "$LIB_DIR" ] && return 0
    fi
    if [ -e /usr/include/nccl.h ]; then
        INCLUDE_DIR=/usr/include; LIB_DIR=$(lib_dir_in "${SYSTEM_LIB_DIRS[@]}")
        WHERE="the system package (/usr/include/nccl.h)"
        [ -n "$LIB_DIR" ] && return 0
    fi
    python_dir=$(python3 -c "import nvidia.nccl as m; print(m.__path__[0])" 2>/dev/null)
    if [ -n "$python_dir" ] && [ -e "$python_dir/include/nccl.h" ]; then
        INCLUDE_DIR=$python_dir/include; LIB_DIR=$(lib_dir_in "$python_dir/lib")
        WHERE="the nvidia-nccl Python package ($python_dir)"
        [ -n "$LIB_DIR" ] && return 0
    fi
    return 1
}

if ! find_nccl; then
    echo "error: NCCL not found (nccl.h with libnccl.so or libnccl.so.2) in \$NCCL_HOME, $CUDA_HOME," \
         "/usr/include or the nvidia-nccl Python package" >&2
    echo "  hint: set NCCL_HOME=DIR (DIR/include/nccl.h, DIR/lib/libnccl.so*), or pip install nvidia-nccl-cu13" >&2
    exit 1
fi

is_system_dir=0
for dir in "${SYSTEM_LIB_DIRS[@]}"; do [ "$LIB_DIR" = "$dir" ] && is_system_dir=1; done
case "${1:-}" in
    --cflags) [ "$INCLUDE_DIR" != /usr/include ] && echo "-I$INCLUDE_DIR" || echo "" ;;
    --libs)
        flags="-L$LIB_DIR"
        if [ -e "$LIB_DIR/libnccl.so" ]; then flags="$flags -lnccl"; else flags="$flags -l:libnccl.so.2"; fi
        [ "$is_system_dir" -eq 0 ] && flags="$flags -Xlinker -rpath=$LIB_DIR"
        echo "$flags" ;;
    --where) echo "NCCL from $WHERE: $INCLUDE_DIR/nccl.h, $LIB_DIR" ;;
    *) echo "usage: $0 --cflags | --libs | --where" >&2; exit 2 ;;
esac

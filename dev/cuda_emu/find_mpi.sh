#!/usr/bin/env bash
# find_mpi.sh: the flags MPI's C++ wrapper (mpicxx) adds, for the host compiler and for nvcc. The
# Makefile and emu.mk build every MPI program through it, so that a wrapper printing what nvcc does
# not take (-pthread, -Wl,-rpath -Wl,DIR, ...: stock OpenMPI, HPC-X, MPICH) still builds.
#
#   bash dev/cuda_emu/find_mpi.sh --cflags        what mpicxx adds when compiling (g++ takes them as they are)
#   bash dev/cuda_emu/find_mpi.sh --libs          what mpicxx adds when linking
#   bash dev/cuda_emu/find_mpi.sh --nvcc-cflags   --cflags for nvcc
#   bash dev/cuda_emu/find_mpi.sh --nvcc-libs     --libs for nvcc
#   bash dev/cuda_emu/find_mpi.sh --where         one line saying which wrapper answered, and how
#
# The wrapper is $MPICXX (default mpicxx, looked up on PATH). It is asked, in order, as OpenMPI's
# (and HPC-X's) answers (--showme:compile, --showme:link), then as MPICH's, MVAPICH's and Intel
# MPI's (-show: the whole command line; -I, -D, -U, -isystem and -pthread are kept for compiling,
# -L, -l, -Wl, -Xlinker, -pthread and library files for linking). For nvcc, -I, -D, -U, -isystem,
# -L, -l and files pass as they are, -Wl,A,B becomes -Xlinker A,B, and any other option goes to the
# host compiler through -Xcompiler (-pthread becomes -Xcompiler -pthread).
# Exits 1, with a message on stderr, when there is no wrapper or it answers neither way.
set -u
MPICXX=${MPICXX:-mpicxx}

usage() { echo "usage: $0 --cflags | --libs | --nvcc-cflags | --nvcc-libs | --where" >&2; exit 2; }
case "${1:-}" in --cflags|--libs|--nvcc-cflags|--nvcc-libs|--where) ;; *) usage ;; esac

if ! command -v "$MPICXX" > /dev/null 2>&1; then
    echo "error: no MPI C++ wrapper '$MPICXX' on PATH" >&2
    echo "  hint: install MPI (Debian/Ubuntu: apt install libopenmpi-dev openmpi-bin), or set MPICXX=/path/to/mpicxx" >&2
    exit 1
fi

# sets COMPILE, LINK (word lists) and HOW from the wrapper's answers
ask_wrapper() {
    local compile link show word next
    if compile=$("$MPICXX" --showme:compile 2>/dev/null) && link=$("$MPICXX" --showme:link 2>/dev/null); then
        read -r -a COMPILE <<< "$compile"
        read -r -a LINK <<< "$link"
        HOW="--showme:compile/--showme:link (OpenMPI)"
        return 0
    fi
    show=$("$MPICXX" -show 2>/dev/null) || return 1
    local words
    read -r -a words <<< "$show"
    [ "${#words[@]}" -gt 0 ] || return 1
    COMPILE=(); LINK=()
    local i=1   # words[0] is the compiler the wrapper runs
    while [ "$i" -lt "${#words[@]}" ]; do
        word=${words[$i]}; next=${words[$((i + 1))]:-}
        case "$word" in
            -I*|-D*|-U*) COMPILE+=("$word") ;;
            -isystem) COMPILE+=("$word" "$next"); i=$((i + 1)) ;;
            -pthread) COMPILE+=("$word"); LINK+=("$word") ;;
            -L*|-l*|-Wl,*) LINK+=("$word") ;;
            -Xlinker) LINK+=("$word" "$next"); i=$((i + 1)) ;;
            *.so|*.so.*|*.a) LINK+=("$word") ;;
        esac   # anything else (-O2, -c, the compiler's own options) is the wrapper's business, not ours
        i=$((i + 1))
    done
    HOW="-show (MPICH, MVAPICH, Intel MPI)"
}

# the words of $@, rewritten for nvcc
for_nvcc() {
    local out=() word
    while [ "$#" -gt 0 ]; do
        word=$1; shift
        case "$word" in
            -I?*|-D?*|-U?*|-L?*|-l?*) out+=("$word") ;;
            -isystem|-Xlinker) out+=("$word" "${1:-}"); shift ;;
            -Wl,*) out+=(-Xlinker "${word#-Wl,}") ;;
            -*) out+=(-Xcompiler "$word") ;;
            *) out+=("$word") ;;   # a library file
        esac
    done
    echo "${out[*]}"
}

if ! ask_wrapper; then
    echo "error: '$MPICXX' ($(command -v "$MPICXX")) answers neither --showme:compile (OpenMPI) nor -show (MPICH)" >&2
    echo "  hint: set MPICXX to your MPI's C++ wrapper, or build without MPI (make MPI=0)" >&2
    exit 1
fi

case "$1" in
    --cflags) echo "${COMPILE[*]}" ;;
    --libs) echo "${LINK[*]}" ;;
    --nvcc-cflags) for_nvcc "${COMPILE[@]}" ;;
    --nvcc-libs) for_nvcc "${LINK[@]}" ;;
    --where) echo "MPI from $(command -v "$MPICXX"), asked with $HOW" ;;
esac

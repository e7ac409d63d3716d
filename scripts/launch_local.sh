#!/usr/bin/env bash
# launch_local.sh: starts N processes of a program on this machine the way a cluster's launcher
# would, without MPI: each process gets its place in the launcher's environment variables.
#
#   scripts/launch_local.sh [--slurm] N ./build/emu/train_gpt --dist-init file:/tmp/meet ...
#
#   default   torchrun-style: RANK, WORLD_SIZE, LOCAL_RANK (and LOCAL_WORLD_SIZE) as torchrun sets them
#   --slurm   srun's: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_NTASKS, SLURM_LOCALID
#
# Every process writes where this script does (the trainer silences the stdout of ranks above 0).
# The processes share a job secret for --dist-init (llmc/rendezvous.h): LLMC_DIST_SECRET (or
# LLMC_DIST_SECRET_FILE) as set, else a fresh random one made here for this launch.
# The script waits for every process and exits with the first
# non-zero status among them (0 when all succeeded); a signal to it (Ctrl-C) ends them all.
set -u
kind=torch
if [ "${1:-}" = "--slurm" ]; then kind=slurm; shift; fi
if [ $# -lt 2 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [--slurm] N program [args...]" >&2
    exit 2
fi
n=$1
shift
if [ -z "${LLMC_DIST_SECRET:-}" ] && [ -z "${LLMC_DIST_SECRET_FILE:-}" ]; then
    LLMC_DIST_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    export LLMC_DIST_SECRET
fi
pids=()
trap 'kill "${pids[@]}" 2>/dev/null' INT TERM
for ((r = 0; r < n; r++)); do
    if [ "$kind" = slurm ]; then
        SLURM_PROCID=$r SLURM_STEP_NUM_TASKS=$n SLURM_NTASKS=$n SLURM_LOCALID=$r "$@" &
    else
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n "$@" &
    fi
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid"
    rc=$?
    if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
done
exit $status

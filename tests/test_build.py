"""test_build.py: the CUDA trainer builds on the boxes users have, each build made for real (nvcc for
GPU_ARCH, and the emulated device) into build/variants/ (the one without MPI into build/emu_nompi/,
which `make test` uses too) and run where it can (`make build-check`; CI):
  - an MPI whose mpicxx prints what nvcc stops on (-pthread, -Wl,-rpath -Wl,DIR,
    -Wl,--enable-new-dtags, as stock OpenMPI and HPC-X do; a fake mpicxx first on PATH, with the
    real include and library folders): nvcc builds the trainer (the rpath reaches the linker),
    where nvcc given the wrapper's flags as they are stops; the emulated build with the same
    mpicxx trains on 2 ranks. The same through MPICH's `mpicxx -show`;
  - a box with neither NCCL nor MPI (a finder that finds no NCCL, MPI=0): nvcc builds a one-GPU
    trainer, the Makefile says so, and NCCL=1 stops the build instead;
  - the emulated trainer without NCCL (NCCL=0): one rank trains, 2 ranks stop naming the rebuild
    (--zero 0 and --zero 1), 2 ranks with --offload optimizer (MPI on the host) train;
  - the emulated trainer without MPI (MPI=0), started as one of several processes by an MPI
    launcher (its variables, and mpirun itself): stops at start-up naming the rebuild.

    python3 tests/test_build.py ./test_gpt
"""

import os
import re
import shutil
import subprocess
import sys

import e2e

(TESTER,) = e2e.usage(sys.argv, ["./test_gpt"])
s = e2e.Suite("test_build", tester=TESTER, run_limit=900)  # a build on a busy two-core machine: minutes
FIX, W = s.fix, s.root
VARIANTS = "build/variants"
NVCC = os.environ.get("NVCC") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")  # as emu.mk
HAVE_NVCC = os.path.exists(NVCC)
HAVE_MPI = shutil.which("mpicxx") and shutil.which("mpirun")
TRAIN = ["-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
         "-x", "2", "-n", "0", "--precision", "fp32"]
REBUILD = "make -B train_gpt_cu prints where it found NCCL"   # cuda/nccl.cuh's hint


def make(name, target, env=None, variables=(), expect_ok=True):
    """builds TARGET afresh (its folder removed first) with make VARIABLES and ENV; returns the run"""
    shutil.rmtree(os.path.dirname(target), ignore_errors=True)
    r = s.run(["make", *variables, target], env=env)
    if expect_ok:
        s.check(name, r.rc == 0 and os.path.exists(target), f"exit code {r.rc}: {(r.out + r.err)[-1500:]}")
    return r


def fake_mpicxx(kind):
    """a folder holding an mpicxx that answers as OpenMPI (--showme) or MPICH (-show) would on a
    box whose MPI adds -pthread and an rpath, with this machine's real MPI folders"""
    real = {k: subprocess.run(["mpicxx", f"--showme:{k}"], capture_output=True, text=True).stdout.split()
            for k in ("incdirs", "libdirs", "libs")}
    inc = " ".join(f"-I{d}" for d in real["incdirs"])
    lib = " ".join([f"-L{d}" for d in real["libdirs"]] + [f"-l{x}" for x in real["libs"]])
    extra = "-pthread -Wl,-rpath -Wl,/opt/x/lib -Wl,--enable-new-dtags"
    d = s.path(f"fake_{kind}")
    os.makedirs(d)
    if kind == "openmpi":
        body = (f'case "$1" in\n  --showme:compile) echo "{inc} -pthread" ;;\n'
                f'  --showme:link) echo "{extra} {lib}" ;;\n  *) exit 1 ;;\nesac\n')
    else:  # MPICH: no --showme (an unknown option is an error), -show prints the whole command
        body = f'[ "$1" = -show ] || exit 1\necho "g++ {inc} -O2 {extra} {lib}"\n'
    with open(f"{d}/mpicxx", "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(f"{d}/mpicxx", 0o755)
    return {"PATH": f"{d}:{os.environ['PATH']}"}


def runpath(binary):
    r = s.run(["readelf", "-d", binary])
    return " ".join(re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", r.out))


def needed(binary):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]*)\]", s.run(["readelf", "-d", binary]).out)


# ----------------------------------------------------------------------------
# MPI that prints what nvcc does not take

if not HAVE_MPI:
    s.skip("builds with an mpicxx printing -pthread and -Wl,...", "no mpicxx/mpirun: apt install libopenmpi-dev openmpi-bin")
else:
    openmpi = fake_mpicxx("openmpi")
    if not HAVE_NVCC:
        s.skip("nvcc builds with the fake mpicxx", "no nvcc")
    else:
        # the premise: nvcc stops on the wrapper's flags as they are (what the Makefile did before)
        src = s.path("mpi_hello.cu")
        with open(src, "w") as f:
            f.write("#include <mpi.h>\nint main(int c, char** v) { MPI_Init(&c, &v); return MPI_Finalize(); }\n")
        flags = subprocess.run(["sh", "-c", "mpicxx --showme:compile; mpicxx --showme:link"], env=dict(os.environ, **openmpi),
                               capture_output=True, text=True).stdout.split()
        r = s.run([NVCC, "-DOMPI_SKIP_MPICXX", *flags, src, "-o", s.path("mpi_hello")])
        s.check("the fake mpicxx's flags, as they are, stop nvcc (the case this suite is for)",
                r.rc != 0 and "Unknown option" in r.err, f"exit code {r.rc}: {r.err[:300]}")
        target = f"{VARIANTS}/fakempi/train_gpt_cu"
        r = make("nvcc builds train_gpt_cu with an mpicxx printing -pthread and -Wl,-rpath -Wl,/opt/x/lib", target, openmpi)
        if r.rc == 0:
            s.check("the build says which MPI it used (the fake mpicxx)", "MPI from " + openmpi["PATH"].split(":")[0] in r.out, r.out[-600:])
            s.check("-Wl,-rpath -Wl,/opt/x/lib reached the linker (RUNPATH of train_gpt_cu)", "/opt/x/lib" in runpath(target),
                    f"runpath: {runpath(target)}")
            s.check("train_gpt_cu links MPI and NCCL", any("libmpi" in n for n in needed(target)) and
                    any("libnccl" in n for n in needed(target)), " ".join(needed(target)))
        mpich = fake_mpicxx("mpich")
        r = s.run(["bash", "dev/cuda_emu/find_mpi.sh", "--nvcc-libs"], env=mpich)
        s.check("an MPICH-style mpicxx (-show only): its flags rewritten for nvcc", r.rc == 0 and
                "-Xlinker -rpath -Xlinker /opt/x/lib" in r.out and "-Xcompiler -pthread" in r.out and
                " -pthread" not in r.out.replace("-Xcompiler -pthread", "") and "-Wl," not in r.out, r.out + r.err)
    emu = f"{VARIANTS}/fakempi/emu/train_gpt"
    r = make("the emulated trainer builds with the fake mpicxx", emu, openmpi, [f"EMU_BUILD={VARIANTS}/fakempi/emu"])
    if r.rc == 0:
        s.expect_ok("that build trains on 2 ranks (mpirun -np 2)", e2e.MPIRUN + ["2", emu] + TRAIN + ["-o", s.path("fake2")])

# ----------------------------------------------------------------------------
# no NCCL (and no MPI): a one-GPU trainer

NO_NCCL = ["FIND_NCCL=false"]   # a finder that finds nothing: the box has no NCCL
if not HAVE_NVCC:
    s.skip("nvcc builds without NCCL and MPI", "no nvcc")
else:
    target = f"{VARIANTS}/bare/train_gpt_cu"
    r = make("nvcc builds train_gpt_cu on a box with neither NCCL nor MPI", target, None, NO_NCCL + ["MPI=0"])
    if r.rc == 0:
        s.check("the build says: no NCCL found, a one-GPU trainer", "no NCCL found" in r.out and "a one-GPU trainer" in r.out, r.out[-600:])
        s.check("the build says: no MPI", "no MPI (MPI=0)" in r.out, r.out[-600:])
        s.check("that train_gpt_cu links neither NCCL nor MPI", not any("nccl" in n or "mpi" in n for n in needed(target)),
                " ".join(needed(target)))
    r = make("", f"{VARIANTS}/nccl1/train_gpt_cu", None, NO_NCCL + ["NCCL=1"], expect_ok=False)
    s.check("NCCL=1 where there is none: the build stops before nvcc", r.rc != 0 and "nvcc" not in r.out, (r.out + r.err)[-600:])
    r = s.run(["make", "-n", "-B", "train_gpt_cu"])
    s.check("make train_gpt_cu prints where it found NCCL", "NCCL from " in r.out or "no NCCL found" in r.out, r.out[:600])

emu = f"{VARIANTS}/nonccl/emu/train_gpt"
if not HAVE_MPI:
    s.skip("the emulated trainer without NCCL on 2 ranks", "no mpicxx/mpirun")
elif make("the emulated trainer builds without NCCL (NCCL=0)", emu, None, ["NCCL=0", f"EMU_BUILD={VARIANTS}/nonccl/emu"]).rc == 0:
    s.expect_ok("without NCCL: one rank trains", [emu] + TRAIN + ["-o", s.path("nonccl1")])
    for zero in ("0", "1"):
        s.expect_fail(f"without NCCL: 2 ranks with --zero {zero} stop, naming the rebuild", REBUILD,
                      e2e.MPIRUN + ["2", emu] + TRAIN + ["--zero", zero, "-o", s.path(f"nonccl2_{zero}")])
    s.expect_ok("without NCCL: 2 ranks with --offload optimizer (gradients added over MPI on the host) train",
                e2e.MPIRUN + ["2", emu] + TRAIN + ["--offload", "optimizer", "-o", s.path("nonccl2_offload")])

# ----------------------------------------------------------------------------
# no MPI: several processes started by a launcher stop at start-up

# built where `make test` builds the same trainer (its rule: MPI=0 EMU_BUILD=build/emu_nompi), so that
# CI's `make test` after `make build-check` finds it made
emu = "build/emu_nompi/train_gpt"
NOMPI = "was built without MPI"
if make("the emulated trainer builds without MPI (MPI=0)", emu, None, ["MPI=0", "EMU_BUILD=build/emu_nompi"]).rc == 0:
    s.expect_ok("without MPI: a plain run trains", [emu] + TRAIN + ["-o", s.path("nompi1")])
    # (srun's and torchrun-style variables it joins over NCCL: tests/test_launch.py)
    for var in ("OMPI_COMM_WORLD_SIZE=2", "PMI_SIZE=4", "PMIX_RANK=1"):
        name, value = var.split("=")
        s.expect_fail(f"without MPI, started with {var}: stops at start-up, naming the rebuild", NOMPI,
                      [emu] + TRAIN + ["-o", s.path(f"nompi_{name}")], env={name: value})
    if HAVE_MPI:
        s.expect_fail("without MPI, started by mpirun -np 2: stops, naming the rebuild", NOMPI,
                      e2e.MPIRUN + ["2", emu] + TRAIN + ["-o", s.path("nompi_mpirun")])

s.finish()

/*
emu_mpi.cpp: the program's MPI calls that wait for other ranks, seen first by the emulator (MPI's
profiling interface: each is defined here and calls its PMPI_ twin, which MPI guarantees to exist).

Why: under CUDA_EMU_STREAMS=late-nccl an NCCL collective waits in its stream until something forces
it (emu_stream.cpp). Rank 0 may force one (it synchronizes) while rank 1, which queued the same
collective, waits in an MPI call for rank 0: on a GPU rank 1's collective runs on its own and rank 0
goes on to that MPI call; here nothing would run it, and both would wait forever. So before each of
these calls the emulator runs the queued work of this rank if a collective is among it
(emu_before_host_wait: the whole device, most recently used stream first, as a GPU does while its
host waits), and the ranks only wait for each other where a real GPU would too.

Which: the blocking collectives, communicator constructors, blocking point-to-point calls, the
waits and tests of requests (a loop polling MPI_Test while another rank waits for our collective)
and MPI_Finalize. A program that waits for other ranks by other means (a file, a socket of its own,
an MPI call not listed) can still hang under late-nccl where a GPU would not; the trainer's dist_*
calls are all here, and without MPI its host collectives are NCCL's own (cuda/nccl.cuh).

Without MPI (no CUDA_EMU_MPI) this file is empty. Only late-nccl changes anything: in the other
modes no collective is ever pending.
*/
#include "emu_internal.h"

#ifdef CUDA_EMU_MPI
#include <mpi.h>

// RET MPI_name(PARAMS) { emu_before_host_wait(); return PMPI_name(ARGS); }
#define EMU_MPI_WAITS(name, params, args)      \
    extern "C" int MPI_##name params {         \
        emu_before_host_wait();                \
        return PMPI_##name args;               \
    }

// collectives
EMU_MPI_WAITS(Barrier, (MPI_Comm comm), (comm))
EMU_MPI_WAITS(Bcast, (void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm), (buf, count, type, root, comm))
EMU_MPI_WAITS(Reduce, (const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, int root, MPI_Comm comm),
              (send, recv, count, type, op, root, comm))
EMU_MPI_WAITS(Allreduce, (const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm),
              (send, recv, count, type, op, comm))
EMU_MPI_WAITS(Reduce_scatter, (const void* send, void* recv, const int counts[], MPI_Datatype type, MPI_Op op, MPI_Comm comm),
              (send, recv, counts, type, op, comm))
EMU_MPI_WAITS(Reduce_scatter_block, (const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm),
              (send, recv, count, type, op, comm))
EMU_MPI_WAITS(Scan, (const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm),
              (send, recv, count, type, op, comm))
EMU_MPI_WAITS(Exscan, (const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm),
              (send, recv, count, type, op, comm))
EMU_MPI_WAITS(Gather, (const void* send, int scount, MPI_Datatype stype, void* recv, int rcount, MPI_Datatype rtype, int root,
                       MPI_Comm comm), (send, scount, stype, recv, rcount, rtype, root, comm))
EMU_MPI_WAITS(Gatherv, (const void* send, int scount, MPI_Datatype stype, void* recv, const int rcounts[], const int displs[],
                        MPI_Datatype rtype, int root, MPI_Comm comm), (send, scount, stype, recv, rcounts, displs, rtype, root, comm))
EMU_MPI_WAITS(Allgather, (const void* send, int scount, MPI_Datatype stype, void* recv, int rcount, MPI_Datatype rtype,
                          MPI_Comm comm), (send, scount, stype, recv, rcount, rtype, comm))
EMU_MPI_WAITS(Allgatherv, (const void* send, int scount, MPI_Datatype stype, void* recv, const int rcounts[], const int displs[],
                           MPI_Datatype rtype, MPI_Comm comm), (send, scount, stype, recv, rcounts, displs, rtype, comm))
EMU_MPI_WAITS(Scatter, (const void* send, int scount, MPI_Datatype stype, void* recv, int rcount, MPI_Datatype rtype, int root,
                        MPI_Comm comm), (send, scount, stype, recv, rcount, rtype, root, comm))
EMU_MPI_WAITS(Scatterv, (const void* send, const int scounts[], const int displs[], MPI_Datatype stype, void* recv, int rcount,
                         MPI_Datatype rtype, int root, MPI_Comm comm), (send, scounts, displs, stype, recv, rcount, rtype, root, comm))
EMU_MPI_WAITS(Alltoall, (const void* send, int scount, MPI_Datatype stype, void* recv, int rcount, MPI_Datatype rtype,
                         MPI_Comm comm), (send, scount, stype, recv, rcount, rtype, comm))
EMU_MPI_WAITS(Alltoallv, (const void* send, const int scounts[], const int sdispls[], MPI_Datatype stype, void* recv,
                          const int rcounts[], const int rdispls[], MPI_Datatype rtype, MPI_Comm comm),
              (send, scounts, sdispls, stype, recv, rcounts, rdispls, rtype, comm))

// communicators (collective: every rank of comm takes part)
EMU_MPI_WAITS(Comm_dup, (MPI_Comm comm, MPI_Comm* out), (comm, out))
EMU_MPI_WAITS(Comm_split, (MPI_Comm comm, int color, int key, MPI_Comm* out), (comm, color, key, out))
EMU_MPI_WAITS(Comm_split_type, (MPI_Comm comm, int type, int key, MPI_Info info, MPI_Comm* out), (comm, type, key, info, out))
EMU_MPI_WAITS(Comm_create, (MPI_Comm comm, MPI_Group group, MPI_Comm* out), (comm, group, out))

// point to point, and requests
EMU_MPI_WAITS(Send, (const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm), (buf, count, type, dest, tag, comm))
EMU_MPI_WAITS(Ssend, (const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm), (buf, count, type, dest, tag, comm))
EMU_MPI_WAITS(Recv, (void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Status* status),
              (buf, count, type, source, tag, comm, status))
EMU_MPI_WAITS(Sendrecv, (const void* send, int scount, MPI_Datatype stype, int dest, int stag, void* recv, int rcount,
                         MPI_Datatype rtype, int source, int rtag, MPI_Comm comm, MPI_Status* status),
              (send, scount, stype, dest, stag, recv, rcount, rtype, source, rtag, comm, status))
EMU_MPI_WAITS(Probe, (int source, int tag, MPI_Comm comm, MPI_Status* status), (source, tag, comm, status))
EMU_MPI_WAITS(Iprobe, (int source, int tag, MPI_Comm comm, int* flag, MPI_Status* status), (source, tag, comm, flag, status))
EMU_MPI_WAITS(Wait, (MPI_Request* request, MPI_Status* status), (request, status))
EMU_MPI_WAITS(Waitall, (int count, MPI_Request requests[], MPI_Status statuses[]), (count, requests, statuses))
EMU_MPI_WAITS(Waitany, (int count, MPI_Request requests[], int* index, MPI_Status* status), (count, requests, index, status))
EMU_MPI_WAITS(Test, (MPI_Request* request, int* flag, MPI_Status* status), (request, flag, status))
EMU_MPI_WAITS(Testall, (int count, MPI_Request requests[], int* flag, MPI_Status statuses[]), (count, requests, flag, statuses))

EMU_MPI_WAITS(Finalize, (void), ())

#endif // CUDA_EMU_MPI

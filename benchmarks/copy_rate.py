"""HBM rate of a 16-byte-vector copy loop, by occupancy and loads in flight, with processes sharing one GPU.

    python benchmarks/copy_rate.py --procs 1,2,4 --mib 256

The bandwidth kernels of tilecomm (csrc/cuda) copy with one loop: each block takes a contiguous range of
16-byte vectors, each thread keeps U vectors in flight. With ranks sharing a GPU under MPS, each process
gets 100 / procs percent of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and one block budget. This
measures, for P processes each copying --mib MiB at once (each its own buffers), the aggregate rate of that
loop for threads per block x blocks per SM x U, next to torch's own copy, so the kernels' launch
configuration can be chosen from figures. With --peer each process reads the next one's buffer through a
CUDA IPC mapping (as a pull kernel reads a peer's input). Needs cupy and MPS (scripts/gpu-run starts it).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os

SOURCE = r"""
extern "C" __global__ void copy(const uint4* __restrict__ src, uint4* __restrict__ dst, unsigned long long n) {
  const unsigned long long lo = n * blockIdx.x / gridDim.x, hi = n * (blockIdx.x + 1) / gridDim.x;
  for (unsigned long long v = lo + threadIdx.x; v < hi; v += UNROLL * blockDim.x) {
    uint4 x[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (v + u * blockDim.x < hi) x[u] = __ldcg(src + v + u * blockDim.x);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (v + u * blockDim.x < hi) __stcg(dst + v + u * blockDim.x, x[u]);
  }
}
"""
CONFIGS = [(512, 1, 4), (512, 2, 4), (512, 1, 8), (512, 2, 8), (256, 4, 4), (256, 4, 8), (1024, 1, 8)]


def _proc(i, procs, mib, peer, barrier, handles, results):
    os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(100 // procs)
    import cupy as cp
    import torch

    sms = cp.cuda.Device(0).attributes["MultiProcessorCount"]
    n = (mib << 20) // 16
    # cudaMalloc'd directly (not from cupy's pool): an IPC handle names the start of an allocation
    own = cp.ndarray((n * 4,), dtype=cp.uint32, memptr=cp.cuda.MemoryPointer(cp.cuda.Memory(n * 16), 0))
    own.fill(1)
    dst = cp.empty_like(own)
    handles[i] = cp.cuda.runtime.ipcGetMemHandle(own.data.ptr)
    barrier.wait()
    src = own
    if peer and procs > 1:  # read the next process's buffer through a CUDA IPC mapping, as a pull kernel reads a peer's
        ptr = cp.cuda.runtime.ipcOpenMemHandle(handles[(i + 1) % procs])
        mem = cp.cuda.UnownedMemory(ptr, own.nbytes, None)
        src = cp.ndarray(own.shape, dtype=own.dtype, memptr=cp.cuda.MemoryPointer(mem, 0))
    tsrc, tdst = torch.ones(n * 4, dtype=torch.int32, device="cuda"), torch.empty(n * 4, dtype=torch.int32,
                                                                                   device="cuda")
    kernels = {u: cp.RawKernel(SOURCE.replace("UNROLL", str(u)), "copy") for u in {c[2] for c in CONFIGS}}
    budget = max(1, sms // procs)  # as tilecomm's block budget (cuda/peer_transport.cu)

    def timed(run):
        best = float("inf")
        for _ in range(5):
            cp.cuda.Device(0).synchronize()
            torch.cuda.synchronize()
            barrier.wait()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            run()
            end.record()
            end.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(start, end) * 1e-3)
        return best

    out = {"sms": sms}
    out["torch"] = timed(lambda: tdst.copy_(tsrc))
    for threads, per_sm, unroll in CONFIGS:
        blocks = min(budget * per_sm, 65535)
        k = kernels[unroll]
        out[f"{threads}x{per_sm}/SM,U{unroll}"] = timed(
            lambda k=k, b=blocks, t=threads: k((b,), (t,), (src, dst, cp.uint64(n))))
    results[i] = out
    barrier.wait()  # no process frees its buffer while a peer may still read it


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--peer", action="store_true", help="read the next process's buffer (CUDA IPC)")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    for procs in (int(p) for p in args.procs.split(",")):
        barrier = ctx.Barrier(procs)
        manager = ctx.Manager()
        results, handles = manager.dict(), manager.dict()
        ps = [ctx.Process(target=_proc, args=(i, procs, args.mib, args.peer, barrier, handles, results))
              for i in range(procs)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        if len(results) != procs:
            print(f"procs={procs}: a process failed")
            continue
        bytes_moved = procs * 2 * (args.mib << 20)
        keys = [k for k in results[0] if k != "sms"]
        cells = []
        for k in keys:
            slowest = max(results[i][k] for i in range(procs))
            cells.append(f"{k}={bytes_moved / slowest / 1e9:.0f}GB/s")
        print(f"procs={procs} peer={args.peer} sms={results[0]['sms']} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()

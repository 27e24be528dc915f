// allgather_direct_ll (CUDA, cuda_ipc, LL protocol): every rank writes its
// input as LL lines (Note [LL lines]) into its slot of every peer's LL buffer
// and copies it into its own output block; then it polls its own LL buffer for
// the peers' lines, a batch of peers at a time (Note [LL batches]), and copies
// peer q's into output block q. Cost: no flag round, one one-way trip; per
// rank (p-1) x 2n bytes written to peers, (p-1) x 2n read locally. Wins for
// small messages (n up to the LL buffer), where latency is all that matters;
// larger ones take the registered, NVSHMEM or schedule-executor paths. As the
// LL all_reduce, the kernel is awaited (Note [Awaited calls] in primitives.cuh)
// and loads a thread's first vector before the counter's value is back.

#include "common/error.h"
#include "cuda/allreduce.h"
#include "cuda/primitives.cuh"

namespace tilecomm::cuda {

__global__ void __launch_bounds__(kThreads) allgatherDirectLLKernel(GatherArgs a) {
  const uint64_t nvec = (a.nbytes + 15) / 16;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const bool in_aligned = isAligned(a.in);
  const uint4 x0 = first < nvec ? loadUser(a.in, first, a.nbytes, in_aligned) : uint4{};
  const Call c = beginCall<true>(a);
  const uint32_t flag = llFlag(c.seq);
  // send: my input into slot `rank` of every peer's LL buffer, and into my own output block
  const bool own_aligned = isAligned(a.out[a.rank]);
  for (uint64_t v = first; v < nvec; v += stride) {
    const uint4 x = v == first ? x0 : loadUser(a.in, v, a.nbytes, in_aligned);
    for (int i = 1; i < a.world; ++i) {
      const int q = (a.rank + i) % a.world;
      llSend(llSlotOf(a.peers.base[q], a.capacity, a.ll_capacity, a.world, c.seq, a.rank), v, x, flag);
    }
    storeUser(a.out[a.rank], v, a.nbytes, own_aligned, x);
  }
  // receive: peer q's lines into output block q (Note [LL batches])
  char* own = a.peers.base[a.rank];
  bool ok = true;
  for (uint64_t v = first; ok && v < nvec; v += stride) {
    for (int q0 = 0; ok && q0 < a.world; q0 += kLLBatch) {
      uint4 x[kLLBatch];
      ok = llRecvBatch(a, own, v, c.seq, q0, make_uint4(0, 0, 0, 0), x);
#pragma unroll
      for (int i = 0; i < kLLBatch; ++i) {
        const int q = q0 + i;
        if (ok && q < a.world && q != a.rank) storeUser(a.out[q], v, a.nbytes, isAligned(a.out[q]), x[i]);
      }
    }
  }
  endCall<true>(a, c);
}

uint64_t allGatherDirectLL(PeerTransport& t, const void* in, void* const* out, uint64_t nbytes, cudaStream_t stream,
                           uint64_t timeout_ns) {
  if (nbytes > t.llCapacity()) throw Error(ErrorKind::kInvalid, "LL all_gather called outside its limits");
  GatherArgs a{};
  beginCall(a, t, timeout_ns, KernelKind::kAllGatherLL);
  a.in = static_cast<const char*>(in);
  for (int q = 0; q < t.world(); ++q) a.out[q] = static_cast<char*>(out[q]);
  a.nbytes = nbytes;
  const uint64_t nvec = (nbytes + 15) / 16;
  const LLGrid g = llGrid(nvec, t.world(), t.blockBudget(), t.memory());
  allgatherDirectLLKernel<<<g.blocks, g.threads, 0, stream>>>(a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(ErrorKind::kSystem, std::string("LL all_gather launch: ") + cudaGetErrorString(e));
  return a.launch;
}

}  // namespace tilecomm::cuda

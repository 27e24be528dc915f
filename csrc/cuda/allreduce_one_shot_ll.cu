// allreduce_one_shot_ll (CUDA, cuda_ipc, LL protocol): every rank writes its
// buffer as LL lines (Note [LL lines]) into its slot of every peer's LL buffer,
// then polls its own LL buffer for the peers' lines (Note [LL batches]) and
// combines all p vectors in rank order (its own straight from its buffer).
// Cost: no flag round, one one-way trip; per rank (p-1) x 2n bytes written to
// peers and (p-1) x 2n read locally. Wins for small messages: the data is its
// own signal, so the latency is one store's flight instead of a store plus a
// flag round trip. Every access to a peer is a line the peer waits for: the
// kernel is awaited (Note [Awaited calls] in primitives.cuh). A thread's first
// vector is loaded before the counter's value is back, so the two round trips
// overlap.
#include "cuda/allreduce.h"
#include "cuda/dispatch.cuh"

namespace tilecomm::cuda {

// At most one block per SM of the budget (Note [LL grid]), so the batches' lines get the registers.
template <typename T, RedOp kOp>
__global__ void __launch_bounds__(kThreads) allreduceOneShotLLKernel(DirectArgs a) {
  const uint64_t nvec = (a.nbytes + 15) / 16;
  const bool aligned = (reinterpret_cast<uintptr_t>(a.data) & 15) == 0;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint4 x0 = first < nvec ? loadUser(a.data, first, a.nbytes, aligned) : uint4{};
  const Call c = beginCall<true>(a);
  const uint32_t flag = llFlag(c.seq);
  // send: my vectors into slot `rank` of every peer's LL buffer
  for (uint64_t v = first; v < nvec; v += stride) {
    const uint4 x = v == first ? x0 : loadUser(a.data, v, a.nbytes, aligned);
    for (int i = 1; i < a.world; ++i) {
      const int q = (a.rank + i) % a.world;
      llSend(llSlotOf(a.peers.base[q], a.capacity, a.ll_capacity, a.world, c.seq, a.rank), v, x, flag);
    }
  }
  // receive: every rank combines the same p vectors in rank order (Note [LL batches])
  char* own = a.peers.base[a.rank];
  bool ok = true;
  for (uint64_t v = first; ok && v < nvec; v += stride) {
    const uint4 mine = v == first ? x0 : loadUser(a.data, v, a.nbytes, aligned);  // NOTE: only this thread writes v
    Vec<T> acc;
    for (int q0 = 0; ok && q0 < a.world; q0 += kLLBatch) {
      uint4 x[kLLBatch];
      ok = llRecvBatch(a, own, v, c.seq, q0, mine, x);
#pragma unroll
      for (int i = 0; i < kLLBatch; ++i) {
        if (!ok || q0 + i >= a.world) break;
        if (q0 + i == 0) acc.set(x[i]);
        else acc.template combine<kOp>(x[i]);
      }
    }
    if (ok) storeUser(a.data, v, a.nbytes, aligned, acc.get());
  }
  endCall<true>(a, c);
}

struct OneShotLL {
  template <typename T, RedOp kOp>
  static void launch(const DirectArgs& a, const LLGrid& g, cudaStream_t s) {
    allreduceOneShotLLKernel<T, kOp><<<g.blocks, g.threads, 0, s>>>(a);
  }
};

void launchOneShotLL(const DirectArgs& a, const LLGrid& grid, DType dtype, RedOp op, cudaStream_t s) {
  dispatch<OneShotLL>(a, grid, dtype, op, s);
}

}  // namespace tilecomm::cuda

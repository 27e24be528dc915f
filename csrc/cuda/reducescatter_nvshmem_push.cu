// reducescatter_nvshmem_push (CUDA, NVSHMEM symmetric heap): every rank stores
// its block for peer q into slot `rank` of q's staging buffer (16-byte stores
// through nvshmem_ptr addresses, or NVSHMEM's put-with-signal from the host)
// and raises its push flag there; then waits on its own memory only and
// reduces the p blocks for it in rank order 0..p-1 (its own from its input),
// float16/bfloat16 in float32. Cost: one one-way trip; per rank (p-1) x n
// written to peers, p x n read and reduced locally.
#include "cuda/blocks_launch.cuh"

namespace tilecomm::cuda {

template <typename T, RedOp kOp>
__global__ void __launch_bounds__(kThreads) reducescatterPushKernel(BlockArgs a) {
  const Call c = beginCall(a);
  const uint64_t nvec = (a.nbytes + 15) / 16;
  const Walk w = walkOf(0, nvec);  // Note [Grid walk]
  // send: my block for q into slot `rank` of q's staging buffer
  for (int i = 1; a.write && i < a.world; ++i) {
    const int q = (a.rank + i) % a.world;
    copyVectors(a.in[q], stagingOf(a.peers.base[q], a.capacity, c.seq) + a.rank * a.slot, a.nbytes, w);
  }
  if (a.write) signalPushed(a, c.seq);
  // reduce: once every peer's block is here, all p blocks in rank order
  if (waitPushed(a, c.seq, a.write ? blockIdx.x : 0)) {
    const char* mine = stagingOf(a.peers.base[a.rank], a.capacity, c.seq);
    const char* src[kMaxRanks];
    for (int q = 0; q < a.world; ++q) src[q] = q == a.rank ? a.in[q] : mine + q * a.slot;
    reduceInto<T, kOp>(a, src, w);
  }
  endCall(a, c);
}

struct ReduceScatterPush {
  template <typename T, RedOp kOp>
  static void launch(const BlockArgs& a, int blocks, cudaStream_t s) {
    reducescatterPushKernel<T, kOp><<<blocks, kThreads, 0, s>>>(a);
  }
};

void launchReduceScatterPush(const BlockArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s) {
  dispatch<ReduceScatterPush>(a, blocks, dtype, op, s);
}

}  // namespace tilecomm::cuda

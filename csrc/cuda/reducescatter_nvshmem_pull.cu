// reducescatter_nvshmem_pull (CUDA, NVSHMEM symmetric heap): every rank stages
// its p blocks (or, when its input lies on the symmetric heap, leaves them in
// place) and announces them; then reads block `rank` of every peer through
// nvshmem_ptr addresses and reduces the p blocks in rank order 0..p-1 (its own
// from its input), float16/bfloat16 in float32; a rank read in place waits
// until every peer is done. Cost: one flag round (two in place); per rank
// p x n staged (none in place), (p-1) x n read from peers and p x n reduced.
// The natural reduce_scatter: each rank reads only what it reduces.
#include "cuda/blocks_launch.cuh"

namespace tilecomm::cuda {

template <typename T, RedOp kOp>
__global__ void __launch_bounds__(kThreads) reducescatterPullKernel(BlockArgs a) {
  const Call c = beginCall(a);
  const uint64_t nvec = (a.nbytes + 15) / 16;
  const Walk w = walkOf(0, nvec);  // Note [Grid walk]
  const bool staged = a.source == kStagedSource;
  // stage: my block for q into slot q of my staging buffer (unless read in place)
  char* mine = stagingOf(a.peers.base[a.rank], a.capacity, c.seq);
  for (int q = 0; staged && q < a.world; ++q)
    if (q != a.rank) copyVectors(a.in[q], mine + q * a.slot, a.nbytes, w);
  publishSource(a, c.seq);
  signal(a, 0, c.seq);
  // reduce: block `rank` of every rank, in rank order
  const bool ok = waitPeers(a, 0, c.seq);
  if (ok) {
    const char* src[kMaxRanks];
    for (int q = 0; q < a.world; ++q) src[q] = q == a.rank ? a.in[q] : sourceBlock(a, q, c.seq, a.rank);
    reduceInto<T, kOp>(a, src, w);
  }
  // done: a rank read in place may change its input once every peer has read it
  signal(a, 1, c.seq);
  if (ok && !staged) waitPeers(a, 1, c.seq);
  endCall(a, c);
}

struct ReduceScatterPull {
  template <typename T, RedOp kOp>
  static void launch(const BlockArgs& a, int blocks, cudaStream_t s) {
    reducescatterPullKernel<T, kOp><<<blocks, kThreads, 0, s>>>(a);
  }
};

void launchReduceScatterPull(const BlockArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s) {
  dispatch<ReduceScatterPull>(a, blocks, dtype, op, s);
}

}  // namespace tilecomm::cuda

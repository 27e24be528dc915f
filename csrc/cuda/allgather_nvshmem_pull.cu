// allgather_nvshmem_pull (CUDA, NVSHMEM symmetric heap): every rank stages its
// block (or, when its input lies on the symmetric heap, leaves it in place)
// and announces it; then reads every peer's block through nvshmem_ptr
// addresses with 16-byte loads, rank r starting at peer r+1 so that the peers
// are not all read at once; a rank read in place waits until every peer is
// done. A small call stages on every rank and reads peers' staging buffers
// without asking where their blocks lie (Note [Small calls] in blocks.cu).
// Cost: one flag round (two when read in place); per rank n staged (none in
// place) and (p-1) x n read from peers. Wins from the in-place case: no
// staging copy at all.
#include "cuda/blocks_launch.cuh"

namespace tilecomm::cuda {

__global__ void __launch_bounds__(kThreads, 2) allgatherPullKernel(BlockArgs a) {
  const Call c = beginCall(a);
  const uint64_t nvec = (a.nbytes + 15) / 16;
  const Walk w = walkOf(0, nvec);  // Note [Grid walk]
  char* own = a.peers.base[a.rank];
  const bool staged = a.source == kStagedSource;
  const bool in_aligned = isAligned(a.in[0]), own_aligned = isAligned(a.out[a.rank]);
  // stage: my block into my staging buffer (unless read in place), and into my own output
  char* mine = stagingOf(own, a.capacity, c.seq);
  for (uint64_t v = w.first; v < w.end; v += kUnroll * w.step) {
    uint4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      x[u] = v + u * w.step < w.end ? loadUser(a.in[0], v + u * w.step, a.nbytes, in_aligned) : uint4{};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (v + u * w.step >= w.end) continue;
      if (staged) storeStaging(mine, v + u * w.step, x[u]);
      storeUser(a.out[a.rank], v + u * w.step, a.nbytes, own_aligned, x[u]);
    }
  }
  if (!a.all_staged) publishSource(a, c.seq);
  signal(a, 0, c.seq);
  // read: peer q's block into output block q
  const bool ok = waitPeers(a, 0, c.seq);
  for (int i = 1; ok && i < a.world; ++i) {
    const int q = (a.rank + i) % a.world;
    const char* from = a.all_staged ? stagingOf(a.peers.base[q], a.capacity, c.seq) : sourceBlock(a, q, c.seq, 0);
    copyVectors(from, a.out[q], a.nbytes, w);
  }
  // done: a rank read in place may change its input once every peer has read it (no rank is, when all
  // are staged)
  if (!a.all_staged) signal(a, 1, c.seq);
  if (ok && !staged) waitPeers(a, 1, c.seq);
  endCall(a, c);
}

void launchAllGatherPull(const BlockArgs& a, int blocks, cudaStream_t s) {
  allgatherPullKernel<<<blocks, kThreads, 0, s>>>(a);
}

}  // namespace tilecomm::cuda

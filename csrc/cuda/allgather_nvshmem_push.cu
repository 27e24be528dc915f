// allgather_nvshmem_push (CUDA, NVSHMEM symmetric heap): every rank stores its
// block into slot `rank` of every peer's staging buffer with 16-byte stores
// through nvshmem_ptr addresses (or NVSHMEM's put-with-signal did it from the
// host), raises one push flag per peer, then waits on its own memory only and
// copies the slots into its output. Cost: one one-way trip; per rank (p-1) x n
// written to peers and (p-1) x n copied locally. Wins where a rank's own
// stores are cheaper than its reads of peers (writes need no round trip).
#include "cuda/blocks_launch.cuh"

namespace tilecomm::cuda {

__global__ void __launch_bounds__(kThreads, 2) allgatherPushKernel(BlockArgs a) {
  const Call c = beginCall(a);
  const uint64_t nvec = (a.nbytes + 15) / 16;
  uint64_t lo, hi;
  blockRange(nvec, lo, hi);
  const uint64_t step = kUnroll * blockDim.x;
  const bool in_aligned = isAligned(a.in[0]), own_aligned = isAligned(a.out[a.rank]);
  // send: my block into slot `rank` of every peer's staging buffer, and into my own output
  for (uint64_t v = lo + threadIdx.x; v < hi; v += step) {
    uint4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      x[u] = v + u * blockDim.x < hi ? loadUser(a.in[0], v + u * blockDim.x, a.nbytes, in_aligned) : uint4{};
    for (int i = 1; a.write && i < a.world; ++i) {
      char* slot = stagingOf(a.peers.base[(a.rank + i) % a.world], a.capacity, c.seq) + a.rank * a.slot;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (v + u * blockDim.x < hi) storeStaging(slot, v + u * blockDim.x, x[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (v + u * blockDim.x < hi) storeUser(a.out[a.rank], v + u * blockDim.x, a.nbytes, own_aligned, x[u]);
  }
  if (a.write) signalPushed(a, c.seq);
  // receive: once every peer's block is here, slot q into output block q
  if (waitPushed(a, c.seq, a.write ? blockIdx.x : 0)) {
    const char* mine = stagingOf(a.peers.base[a.rank], a.capacity, c.seq);
    for (int i = 1; i < a.world; ++i) {
      const int q = (a.rank + i) % a.world;
      copyVectors(mine + q * a.slot, a.out[q], a.nbytes, lo, hi);
    }
  }
  endCall(a, c);
}

void launchAllGatherPush(const BlockArgs& a, int blocks, cudaStream_t s) {
  allgatherPushKernel<<<blocks, kThreads, 0, s>>>(a);
}

}  // namespace tilecomm::cuda

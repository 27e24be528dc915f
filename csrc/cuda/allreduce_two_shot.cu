// allreduce_two_shot (CUDA, cuda_ipc): reduce-scatter then all-gather through
// the staging buffers. Every rank stages its buffer and announces it; rank r
// reduces part r (1/p of each block's vectors) from all p staging buffers in
// rank order, writes the result into its own staging buffer and announces
// that; then every rank copies part q from rank q. Cost: 2 flag rounds; per
// rank (p-1)/p x n read and reduced plus (p-1)/p x n gathered. Wins over
// one_shot once the bytes read, not the extra round, dominate.
#include "cuda/allreduce.h"
#include "cuda/dispatch.cuh"

namespace tilecomm::cuda {

template <typename T, RedOp kOp>
__global__ void __launch_bounds__(kThreads, 2) allreduceTwoShotKernel(DirectArgs a) {
  const Call c = beginCall(a);
  const uint64_t nvec = (a.nbytes + 15) / 16;
  const bool aligned = (reinterpret_cast<uintptr_t>(a.data) & 15) == 0;
  uint64_t lo, hi;
  blockRange(nvec, lo, hi);
  const uint64_t nv = hi - lo;
  const uint64_t step = kUnroll * blockDim.x;
  auto part = [&](int q, uint64_t& b, uint64_t& e) {
    b = lo + nv * q / a.world;
    e = lo + nv * (q + 1) / a.world;
  };
  char* mine = stagingOf(a.peers.base[a.rank], a.capacity, c.seq);
  // round 1: stage this block's vectors, announce; reduce part `rank` from every rank
  stageVectors(a, mine, lo, hi, aligned);
  signal(a, 0, c.seq);
  if (!waitPeers(a, 0, c.seq)) return endCall(a, c);
  uint64_t b, e;
  part(a.rank, b, e);
  for (uint64_t v = b + threadIdx.x; v < e; v += step) {
    uint4 x[kUnroll];
    reduceRanks<T, kOp>(a, c.seq, v, blockDim.x, e, x);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (v + u * blockDim.x >= e) continue;
      storeStaging(mine, v + u * blockDim.x, x[u]);  // NOTE: only this rank reads its own part in round 1
      storeUser(a.data, v + u * blockDim.x, a.nbytes, aligned, x[u]);
    }
  }
  // round 2: announce the reduced part; copy part q from rank q
  signal(a, 1, c.seq);
  if (!waitPeers(a, 1, c.seq)) return endCall(a, c);
  for (int i = 1; i < a.world; ++i) {
    const int q = (a.rank + i) % a.world;  // ranks start on different peers
    const char* theirs = stagingOf(a.peers.base[q], a.capacity, c.seq);
    part(q, b, e);
    for (uint64_t v = b + threadIdx.x; v < e; v += step) {
      uint4 x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) x[u] = v + u * blockDim.x < e ? loadPeer(theirs, v + u * blockDim.x) : uint4{};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (v + u * blockDim.x < e) storeUser(a.data, v + u * blockDim.x, a.nbytes, aligned, x[u]);
    }
  }
  endCall(a, c);
}

struct TwoShot {
  template <typename T, RedOp kOp>
  static void launch(const DirectArgs& a, int blocks, cudaStream_t s) {
    allreduceTwoShotKernel<T, kOp><<<blocks, kThreads, 0, s>>>(a);
  }
};

void launchTwoShot(const DirectArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s) {
  dispatch<TwoShot>(a, blocks, dtype, op, s);
}

}  // namespace tilecomm::cuda

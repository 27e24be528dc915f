// allreduce_two_shot (CUDA, cuda_ipc): reduce-scatter then all-gather through
// the staging buffers. Every rank stages its buffer and announces it; rank r
// reduces part r (1/p of the vectors, swept by the whole grid: Note [Grid
// walk]) from all p staging buffers in rank order, writes the result into its
// own staging buffer and announces that; then every rank copies part q from
// rank q. Cost: 2 flag rounds; per
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
  const Walk w = walkOf(0, nvec);  // Note [Grid walk]
  // part q: the vectors [nvec q / p, nvec (q + 1) / p); this block's share of it
  auto part = [&](int q) { return walkOf(nvec * q / a.world, nvec * (q + 1) / a.world); };
  char* mine = stagingOf(a.peers.base[a.rank], a.capacity, c.seq);
  // round 1: stage this block's vectors, announce; reduce part `rank` from every rank
  stageVectors(a, mine, w, aligned);
  signal(a, 0, c.seq);
  if (!waitPeers(a, 0, c.seq)) return endCall(a, c);
  // every rank's loads of a vector in flight together (Note [One vector])
  const auto src = [&](int q) { return stagingOf(a.peers.base[q], a.capacity, c.seq); };
  reduceWalk<T, kOp>(src, a.world, part(a.rank), [&](uint64_t v, const uint4& x) {
    storeStaging(mine, v, x);  // NOTE: only this rank reads its own part in round 1
    storeUser(a.data, v, a.nbytes, aligned, x);
  });
  // round 2: announce the reduced part; copy part q from rank q
  signal(a, 1, c.seq);
  if (!waitPeers(a, 1, c.seq)) return endCall(a, c);
  for (int i = 1; i < a.world; ++i) {
    const int q = (a.rank + i) % a.world;  // ranks start on different peers
    const char* theirs = stagingOf(a.peers.base[q], a.capacity, c.seq);
    const Walk pw = part(q);
    for (uint64_t v = pw.first; v < pw.end; v += kUnroll * pw.step) {
      uint4 x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) x[u] = v + u * pw.step < pw.end ? loadPeer(theirs, v + u * pw.step) : uint4{};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (v + u * pw.step < pw.end) storeUser(a.data, v + u * pw.step, a.nbytes, aligned, x[u]);
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

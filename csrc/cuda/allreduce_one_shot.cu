// allreduce_one_shot (CUDA, cuda_ipc): every rank copies its buffer into its
// staging buffer and announces it (one flag per thread block); once all peers
// have, each rank reads all p staging buffers with 16-byte loads and combines
// them in rank order. Cost: 1 flag round; per rank n bytes staged and (p-1) x n
// read from peers and reduced. Wins for small messages, where one round of
// latency is all that matters. Needs load access to every peer's memory.
#include "cuda/allreduce.h"
#include "cuda/dispatch.cuh"

namespace tilecomm::cuda {

template <typename T, RedOp kOp>
__global__ void __launch_bounds__(kThreads, 2) allreduceOneShotKernel(DirectArgs a) {
  const Call c = beginCall(a);
  const uint64_t nvec = (a.nbytes + 15) / 16;
  const bool aligned = (reinterpret_cast<uintptr_t>(a.data) & 15) == 0;
  const Walk w = walkOf(0, nvec);  // Note [Grid walk]
  // stage: this block's vectors into my staging buffer, then announce them
  stageVectors(a, stagingOf(a.peers.base[a.rank], a.capacity, c.seq), w, aligned);
  signal(a, 0, c.seq);
  if (waitPeers(a, 0, c.seq)) {
    // reduce: every rank combines the same p vectors in rank order
    for (uint64_t v = w.first; v < w.end; v += kUnroll * w.step) {
      if (sizeof(T) >= 4 && v + w.step >= w.end && (v + 1) * 16 <= a.nbytes) {  // Note [One vector]
        const uint4 y = reduceOne<T, kOp, 4>([&](int q) { return stagingOf(a.peers.base[q], a.capacity, c.seq); },
                                          a.world, v);
        storeUser(a.data, v, a.nbytes, aligned, y);
        continue;
      }
      uint4 x[kUnroll];
      reduceRanks<T, kOp>(a, c.seq, v, w.step, w.end, x);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (v + u * w.step < w.end) storeUser(a.data, v + u * w.step, a.nbytes, aligned, x[u]);
    }
  }
  endCall(a, c);
}

struct OneShot {
  template <typename T, RedOp kOp>
  static void launch(const DirectArgs& a, int blocks, cudaStream_t s) {
    allreduceOneShotKernel<T, kOp><<<blocks, kThreads, 0, s>>>(a);
  }
};

void launchOneShot(const DirectArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s) {
  dispatch<OneShot>(a, blocks, dtype, op, s);
}

}  // namespace tilecomm::cuda

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
    // reduce: every rank combines the same p vectors in rank order, every rank's loads of a
    // vector in flight together (Note [One vector])
    const auto src = [&](int q) { return stagingOf(a.peers.base[q], a.capacity, c.seq); };
    reduceWalk<T, kOp>(src, a.world, w, [&](uint64_t v, const uint4& x) { storeUser(a.data, v, a.nbytes, aligned, x); });
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

// alltoall_push_registered (CUDA, cuda_ipc, equal splits into registered outputs; Note [Registered
// tensors] in backend/cuda_glue.hpp): the host mapped every rank's output (BlockArgs::tensor).
// Once every peer's kernel has started (phase 0: its output is free to write), rank r stores its
// block q straight into block r of rank q's output with 16-byte stores, and its own block into its
// own output; it raises one push flag per peer and waits, on its own memory, for every peer's.
// Cost: two flag rounds; per rank n read and n written, the least an all_to_all moves (the FIFO
// kernel, alltoall_fifo.cu, copies every byte twice).
#include "cuda/blocks_launch.cuh"

namespace tilecomm::cuda {

__global__ void __launch_bounds__(kThreads, 2) alltoallPushKernel(BlockArgs a) {
  const Call c = beginCall(a);
  const Walk w = walkOf(0, (a.nbytes + 15) / 16);  // Note [Grid walk]
  signal(a, 0, c.seq);
  const bool ok = waitPeers(a, 0, c.seq);
  for (int i = 0; ok && i < a.world; ++i) {  // i = 0: the own block
    const int q = (a.rank + i) % a.world;
    copyVectors(a.in[q], a.tensor[q] + a.rank * a.stride, a.nbytes, w);
  }
  if (ok) {
    signalPushed(a, c.seq);
    waitPushed(a, c.seq, blockIdx.x);  // every peer's block is in my output
  }
  endCall(a, c);
}

void launchAllToAllPush(const BlockArgs& a, int blocks, cudaStream_t s) {
  alltoallPushKernel<<<blocks, kThreads, 0, s>>>(a);
}

}  // namespace tilecomm::cuda

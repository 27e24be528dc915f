// allgather_nvshmem_push (CUDA, NVSHMEM symmetric heap): every rank announces
// where its output lies (Note [Block sources]); then stores its block into
// every peer with 16-byte stores through nvshmem_ptr addresses, straight into
// the peer's output when that lies on the symmetric heap, else into slot
// `rank` of the peer's staging buffer (or NVSHMEM's put-with-signal did that
// from the host, without the announcement); raises one push flag per peer and
// waits on its own memory only; a staged rank then copies the slots into its
// output. A small call stages on every rank and is not announced (Note [Small
// calls] in blocks.cu). Cost: two flag rounds (one when small or with
// put-with-signal); per rank (p-1) x n written to peers, plus (p-1) x n copied
// locally when staged. With outputs on
// the heap it moves the least any all_gather can: n read, p x n written. The
// same kernel runs over cuda_ipc into registered outputs (Note [Registered
// tensors] in backend/cuda_glue.hpp): the host mapped every rank's output
// (BlockArgs::tensor), and peers store into it in place.
#include "cuda/blocks_launch.cuh"

namespace tilecomm::cuda {

__global__ void __launch_bounds__(kThreads, 2) allgatherPushKernel(BlockArgs a) {
  const Call c = beginCall(a);
  const uint64_t nvec = (a.nbytes + 15) / 16;
  const Walk w = walkOf(0, nvec);  // Note [Grid walk]
  const bool in_aligned = isAligned(a.in[0]), own_aligned = isAligned(a.out[a.rank]);
  // announce: where peers write my output (a.write only: put-with-signal targets staging)
  bool ok = true;
  char* dst[kMaxRanks];
  bool staged[kMaxRanks], aligned[kMaxRanks];
  if (a.write) {
    if (!a.all_staged) {
      publishDest(a, c.seq);
      signal(a, 0, c.seq);
      ok = waitPeers(a, 0, c.seq);
    }
    for (int q = 0; ok && q < a.world; ++q) {
      if (q == a.rank) continue;
      if (a.dest == kRegisteredSource) {  // the host mapped every output
        dst[q] = a.tensor[q] + a.rank * a.stride;
        staged[q] = false;
      } else if (a.all_staged) {  // Note [Small calls]: slot `rank` of q's staging buffer
        dst[q] = stagingOf(a.peers.base[q], a.capacity, c.seq) + a.rank * a.slot;
        staged[q] = true;
      } else {
        dst[q] = destBlock(a, q, c.seq, &staged[q]);
      }
      aligned[q] = isAligned(dst[q]);
    }
  }
  // send: my block into every peer, and into my own output
  for (uint64_t v = w.first; ok && v < w.end; v += kUnroll * w.step) {
    uint4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      x[u] = v + u * w.step < w.end ? loadUser(a.in[0], v + u * w.step, a.nbytes, in_aligned) : uint4{};
    for (int i = 1; a.write && i < a.world; ++i) {
      const int q = (a.rank + i) % a.world;
      char* const to = dst[q];  // in registers: a store through `to` could alias the arrays
      const bool to_staging = staged[q], to_aligned = aligned[q];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (v + u * w.step >= w.end) continue;
        if (to_staging) storeStaging(to, v + u * w.step, x[u]);
        else storeUser(to, v + u * w.step, a.nbytes, to_aligned, x[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (v + u * w.step < w.end) storeUser(a.out[a.rank], v + u * w.step, a.nbytes, own_aligned, x[u]);
  }
  if (ok && a.write) signalPushed(a, c.seq);
  // receive: once every peer's block is here, a staged rank copies slot q into output block q
  if (ok && waitPushed(a, c.seq, a.write ? blockIdx.x : 0) && a.dest == kStagedSource) {
    const char* mine = stagingOf(a.peers.base[a.rank], a.capacity, c.seq);
    for (int i = 1; i < a.world; ++i) {
      const int q = (a.rank + i) % a.world;
      copyVectors(mine + q * a.slot, a.out[q], a.nbytes, w);
    }
  }
  endCall(a, c);
}

void launchAllGatherPush(const BlockArgs& a, int blocks, cudaStream_t s) {
  allgatherPushKernel<<<blocks, kThreads, 0, s>>>(a);
}

}  // namespace tilecomm::cuda

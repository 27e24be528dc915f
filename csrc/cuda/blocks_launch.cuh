// Device side shared by the block kernels of blocks.h: where a rank's input is
// read from (Note [Block sources]) and the kernels' launchers.
#pragma once

#include "cuda/blocks.h"
#include "cuda/dispatch.cuh"

namespace tilecomm::cuda {

// Note [Block sources]: before a pull kernel announces its input (phase 0), each
// of its thread blocks writes where the input lies into sourceOf(own, seq): its
// staging buffer (kStagedSource) or, in place, an offset from its area's base on
// the symmetric heap. A peer reads the word after it saw the announcement of
// the same thread block, so the release that published the announcement also
// published the word. Ranks of one call may differ (one in place, one staged).
// all_gather push publishes its output the same way (destOf): peers store into
// it in place when it lies on the heap, into its staging buffer otherwise; the
// all_reduce two-shot stores its results through the source word too. A
// word of parity s & 1 is rewritten only by call s + 2, which starts after
// every peer's call s has read it (call s ends after every peer's block wrote).

/// Block-wide, before signal(a, 0, seq): publishes where this rank's input of call seq lies.
__device__ __forceinline__ void publishSource(const BlockArgs& a, uint64_t seq) {
  if (threadIdx.x == 0) *reinterpret_cast<volatile int64_t*>(sourceOf(a.peers.base[a.rank], seq)) = a.source;
}

/// Rank q's block `index` of call seq (after waitPeers(a, 0, seq)): in q's staging buffer
/// (slot `index`), or in place on the heap (block `index` of its input).
__device__ __forceinline__ const char* sourceBlock(const BlockArgs& a, int q, uint64_t seq, int index) {
  char* base = a.peers.base[q];
  const int64_t at = *reinterpret_cast<volatile int64_t*>(sourceOf(base, seq));
  if (at == kStagedSource) return stagingOf(base, a.capacity, seq) + index * a.slot;
  return base + at + index * a.stride;
}

/// Block-wide, before signal(a, 0, seq): publishes where peers write this rank's output of call
/// seq (all_gather push; Note [Block sources], for the destination).
__device__ __forceinline__ void publishDest(const BlockArgs& a, uint64_t seq) {
  if (threadIdx.x == 0) *reinterpret_cast<volatile int64_t*>(destOf(a.peers.base[a.rank], seq)) = a.dest;
}

/// Where this rank's block of call seq goes in rank q's memory (after waitPeers(a, 0, seq)):
/// slot `rank` of q's staging buffer (*staged set), or block `rank` of q's output in place.
__device__ __forceinline__ char* destBlock(const BlockArgs& a, int q, uint64_t seq, bool* staged) {
  char* base = a.peers.base[q];
  const int64_t at = *reinterpret_cast<volatile int64_t*>(destOf(base, seq));
  *staged = at == kStagedSource;
  if (*staged) return stagingOf(base, a.capacity, seq) + a.rank * a.slot;
  return base + at + a.rank * a.stride;
}

/// Bytes of part j of an n-byte piece cut into parts of `stride` bytes (the two-shot's; the host
/// checks its rank's part with it too, Note [Registered parts]).
__host__ __device__ __forceinline__ uint64_t partBytes(const BlockArgs& a, int j) {
  const uint64_t at = j * a.stride;
  return at >= a.nbytes ? 0 : a.nbytes - at < a.stride ? a.nbytes - at : a.stride;
}

/// This thread's vectors of walk w of out[0] = src[0..p-1] reduced in rank order (reduceFrom).
template <typename T, RedOp kOp>
__device__ __forceinline__ void reduceInto(const BlockArgs& a, const char* const* src, const Walk& w) {
  const bool aligned = isAligned(a.out[0]);
  for (uint64_t v = w.first; v < w.end; v += kUnroll * w.step) {
    uint4 x[kUnroll];
    reduceFrom<T, kOp>(src, a.world, a.nbytes, v, w.step, w.end, x);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (v + u * w.step < w.end) storeUser(a.out[0], v + u * w.step, a.nbytes, aligned, x[u]);
  }
}

void launchAllGatherPush(const BlockArgs& a, int blocks, cudaStream_t s);
void launchAllToAllPush(const BlockArgs& a, int blocks, cudaStream_t s);
void launchAllGatherPull(const BlockArgs& a, int blocks, cudaStream_t s);
void launchReduceScatterPush(const BlockArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s);
void launchReduceScatterPull(const BlockArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s);
void launchAllReduceNvshmemTwoShot(const BlockArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s);
/// The registered two-shot where every rank's part `rank` is aligned and whole (Note [Registered parts]).
void launchAllReduceRegisteredParts(const BlockArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s);

}  // namespace tilecomm::cuda

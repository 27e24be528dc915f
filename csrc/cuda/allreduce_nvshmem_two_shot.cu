// allreduce_nvshmem_two_shot (CUDA, NVSHMEM symmetric heap): the tensor is cut
// into p parts of `stride` bytes (a multiple of 16; the last parts may be
// shorter or empty). Every rank stages the parts peers read (or, when its
// tensor lies on the symmetric heap, leaves them in place: Note [Block
// sources]) and announces them; rank r then reads part r of every rank through
// nvshmem_ptr addresses, reduces them in rank order 0..p-1 (its own from its
// tensor; float16/bfloat16 in float32) and stores the result back into part r
// of every rank's copy, in place or staged; once every peer said so (phase 1),
// a staged rank copies its parts out of its staging buffer. Part r of any copy
// is read and written by rank r alone, so the stores need no further round.
// Phase 1 is announced with push flags (Note [Push flags]), so every access to
// a peer's memory (a flag polled, a part read or stored) comes before a store
// that the peer waits for: the kernel is awaited (Note [Awaited calls] in
// primitives.cuh).
// Cost: two flag rounds; per rank n read from peers and n written to them;
// staged, 2n more (copy in, copy out). With every tensor on the heap it moves
// what SymmetricMemory's two-shot moves. Over cuda_ipc, on registered tensors
// (Note [Registered tensors] in backend/cuda_glue.hpp), the host mapped every
// rank's tensor, and parts are read and stored through those addresses
// (BlockArgs::tensor), in place, with no staging at all: by this kernel, or
// where a rank's part is whole and aligned, by the kernel of Note [Registered
// parts], which follows the same rounds.
#include "cuda/blocks_launch.cuh"

namespace tilecomm::cuda {

namespace {

/// This thread's vectors of part j: walk w (over a part's vectors) stopped at part j's end.
__device__ __forceinline__ Walk partWalk(const BlockArgs& a, int j, const Walk& w) {
  return clipped(w, (partBytes(a, j) + 15) / 16);
}

}  // namespace

// Note [Registered parts]: over registered tensors whose parts `rank` are all aligned and whole (a
// multiple of 16 bytes), a part is reduced and stored straight through the mapped tensors, with the
// one_shot's loop (reduceWalk), by a kernel of its own (allreduceRegisteredPartsKernel; the host
// checks the parts, allReduceRegistered in blocks.cu). The general kernel keeps every rank's source
// and destination in arrays indexed at run time, which live in local memory (a 256-288-byte stack
// frame), and picks its loads per vector; parts that are not whole keep it. The two kernels raise
// and wait for the same flags, so ranks of one call may run either (the rank whose part ends off a
// 16-byte boundary runs the general one). Reducing registered parts without the arrays, inside the
// general kernel, took 0.7-1.5 us off its time at 2 and 4 ranks, 64 KiB-1 MiB of float32 (one H100,
// graph replay; docs/benchmarks.md, "The registered two-shot without pointer arrays"); 8-bit types
// kept the general loop there, where reduceWalk's loads spilled. In a kernel of its own the path
// takes 44-64 registers a thread, no stack and no spill for every type, where the general kernel's
// instances take 100-128 and such a stack (at 128 registers, a block of kThreads fills an SM's
// register file). The kernel's own time fell by another 0.43-0.62 us at 2 and 4 ranks, 256 KiB-4
// MiB of float32, in every pair of rounds (one H100, graph replay; docs/benchmarks.md, "The
// registered two-shot's whole parts in a kernel of their own").
template <typename T, RedOp kOp>
__global__ void __launch_bounds__(kThreads) allreduceRegisteredPartsKernel(BlockArgs a) {
  const Call c = beginCall<true>(a);  // awaited, as the general kernel below
  signal(a, 0, c.seq);  // registered: peers read and write my mapped tensor, no source to publish
  bool ok = waitPeers(a, 0, c.seq);
  if (ok) {
    // reduce: part `rank` of every rank in rank order, then store it into every rank's copy
    const uint64_t at = a.rank * a.stride;
    const Walk own = partWalk(a, a.rank, walkOf(0, a.stride / 16));  // Note [Grid walk]
    const auto copy = [&](int q) { return a.tensor[q] + at; };
    reduceWalk<T, kOp>(copy, a.world, own, [&](uint64_t v, const uint4& x) {
      for (int i = 0, q = a.rank; i < a.world; ++i, q = q + 1 == a.world ? 0 : q + 1)  // staggered
        *reinterpret_cast<uint4*>(copy(q) + v * 16) = x;
    });
  }
  // stored: as in the general kernel below (and its NOTE on a failed wait)
  if (ok) signalPushed(a, c.seq);
  if (ok) ok = waitPushed(a, c.seq, blockIdx.x);
  endCall<true>(a, c);
}

template <typename T, RedOp kOp>
__global__ void __launch_bounds__(kThreads) allreduceNvshmemTwoShotKernel(BlockArgs a) {
  const Call c = beginCall<true>(a);
  const Walk w = walkOf(0, a.stride / 16);  // the same vectors of every part (Note [Grid walk])
  const bool staged = a.source == kStagedSource;
  const bool registered = a.source == kRegisteredSource;  // every rank's tensor mapped by the host
  char* mine = stagingOf(a.peers.base[a.rank], a.capacity, c.seq);
  // stage: the parts peers read (every part but mine) into my staging buffer, unless in place
  for (int j = 0; staged && j < a.world; ++j)
    if (j != a.rank) copyVectors(a.in[0] + j * a.stride, mine + j * a.stride, partBytes(a, j), partWalk(a, j, w));
  if (!registered) publishSource(a, c.seq);  // registered: peers use the mapped tensors
  signal(a, 0, c.seq);
  bool ok = waitPeers(a, 0, c.seq);
  if (ok) {
    // reduce: part `rank` of every rank in rank order, then store it into every rank's copy
    const uint64_t len = partBytes(a, a.rank);
    const Walk own = partWalk(a, a.rank, w);
    const char* src[kMaxRanks];
    char* dst[kMaxRanks];
    for (int q = 0; q < a.world; ++q) {
      dst[q] = registered ? a.tensor[q] + a.rank * a.stride
               : q == a.rank ? a.out[0] + a.rank * a.stride
                             : const_cast<char*>(sourceBlock(a, q, c.seq, a.rank));
      src[q] = q == a.rank ? a.in[0] + a.rank * a.stride : dst[q];
    }
    bool wide = sizeof(T) >= 2;  // Note [One vector]: all peers' loads at once, where aligned
    for (int q = 0; q < a.world; ++q) wide = wide && isAligned(src[q]);
    for (uint64_t v = own.first; v < own.end; v += kUnroll * own.step) {
      uint4 x[kUnroll];
      if (wide && v + own.step >= own.end && (v + 1) * 16 <= len)
        x[0] = reduceOne<T, kOp, 8>([&](int q) { return src[q]; }, a.world, v);
      else reduceFrom<T, kOp>(src, a.world, len, v, own.step, own.end, x);
      // staggered: peers are not all written at once
      for (int i = 0, q = a.rank; i < a.world; ++i, q = q + 1 == a.world ? 0 : q + 1) {
        char* const to = dst[q];  // in a register: a store through it could alias the array
        const bool aligned = isAligned(to);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (v + u * own.step < own.end) storeUser(to, v + u * own.step, len, aligned, x[u]);
      }
    }
  }
  // stored: my part is in every rank's copy (and I read every rank's part `rank`). NOTE: not
  // raised after a failed wait: peers would take their unreduced part r for the result; they
  // time out instead. A peer that arrives after this rank gave up may still store into its
  // tensor in place; the call has failed by then, and the group fails every later call.
  if (ok) signalPushed(a, c.seq);
  if (ok) ok = waitPushed(a, c.seq, blockIdx.x);
  // copy out: a staged rank's parts reduced by the peers
  for (int j = 0; ok && staged && j < a.world; ++j)
    if (j != a.rank) copyVectors(mine + j * a.stride, a.out[0] + j * a.stride, partBytes(a, j), partWalk(a, j, w));
  endCall<true>(a, c);
}

struct AllReduceNvshmemTwoShot {
  template <typename T, RedOp kOp>
  static void launch(const BlockArgs& a, int blocks, cudaStream_t s) {
    allreduceNvshmemTwoShotKernel<T, kOp><<<blocks, kThreads, 0, s>>>(a);
  }
};

void launchAllReduceNvshmemTwoShot(const BlockArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s) {
  dispatch<AllReduceNvshmemTwoShot>(a, blocks, dtype, op, s);
}

struct AllReduceRegisteredParts {
  template <typename T, RedOp kOp>
  static void launch(const BlockArgs& a, int blocks, cudaStream_t s) {
    allreduceRegisteredPartsKernel<T, kOp><<<blocks, kThreads, 0, s>>>(a);
  }
};

void launchAllReduceRegisteredParts(const BlockArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s) {
  dispatch<AllReduceRegisteredParts>(a, blocks, dtype, op, s);
}

}  // namespace tilecomm::cuda

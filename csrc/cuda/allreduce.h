// Direct all-reduce kernels over the cuda_ipc transport (one file each:
// allreduce_one_shot.cu, allreduce_two_shot.cu, allreduce_one_shot_ll.cu). All
// reduce in place, in rank order 0..p-1, with float16/bfloat16 accumulated in
// float32, so every rank ends with the same bits. None takes a per-call value
// from the host, so all can be captured in CUDA graphs (Note [Device sequence]).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/types.h"
#include "cuda/peer_transport.h"

namespace tilecomm::cuda {

enum class DirectAlgo : uint8_t { kOneShot, kTwoShot, kOneShotLL };

/// Whether the kernels reduce `dtype` with `op` (complex dtypes take the staged path).
bool directSupports(DType dtype, RedOp op);

/// Enqueues an in-place all-reduce of nbytes at `data` (device memory of t's device) on
/// `stream`. Requires directSupports() and nbytes <= t.capacity() (t.llCapacity() for
/// kOneShotLL). Returns the kernel's launch id; a timed-out wait shows up in t.failedLaunch().
uint64_t allReduceDirect(DirectAlgo algo, PeerTransport& t, void* data, uint64_t nbytes, DType dtype, RedOp op,
                         cudaStream_t stream, uint64_t timeout_ns);

/// Enqueues an LL all-gather (allgather_direct_ll.cu): nbytes at `in` from every rank q land
/// at out[q] (out has t.world() entries). Requires nbytes <= t.llCapacity(). Returns the
/// kernel's launch id.
uint64_t allGatherDirectLL(PeerTransport& t, const void* in, void* const* out, uint64_t nbytes, cudaStream_t stream,
                           uint64_t timeout_ns);

}  // namespace tilecomm::cuda

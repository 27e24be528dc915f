// Direct all-reduce kernels over the cuda_ipc transport (one file each:
// allreduce_one_shot.cu, allreduce_two_shot.cu). Both reduce in place, in rank
// order 0..p-1, with float16/bfloat16 accumulated in float32, so every rank
// ends with the same bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/types.h"
#include "cuda/cuda_ipc.h"

namespace tilecomm::cuda {

enum class DirectAlgo : uint8_t { kOneShot, kTwoShot };

/// Whether the kernels reduce `dtype` with `op` (complex dtypes take the staged path).
bool directSupports(DType dtype, RedOp op);

/// Enqueues an in-place all-reduce of nbytes at `data` (device memory of t's device) on
/// `stream`. Requires nbytes <= t.capacity() and directSupports(). Returns the call's
/// sequence number (Note [Flags]); a timed-out wait shows up in t.failedSeq().
uint64_t allReduceDirect(DirectAlgo algo, IpcTransport& t, void* data, uint64_t nbytes, DType dtype, RedOp op,
                         cudaStream_t stream, uint64_t timeout_ns);

}  // namespace tilecomm::cuda

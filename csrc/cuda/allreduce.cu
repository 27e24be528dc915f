// Host side of the direct all-reduce kernels: checks, grid size, sequence numbers.
#include "cuda/allreduce.h"

#include <algorithm>

#include "common/error.h"
#include "cuda/dispatch.cuh"

namespace tilecomm::cuda {

bool directSupports(DType dtype, RedOp op) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
    case DType::kFloat64: return op == RedOp::kSum || op == RedOp::kProduct || op == RedOp::kMin || op == RedOp::kMax;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kBool: return op < RedOp::kNone;
    default: return false;
  }
}

uint64_t allReduceDirect(DirectAlgo algo, IpcTransport& t, void* data, uint64_t nbytes, DType dtype, RedOp op,
                         cudaStream_t stream, uint64_t timeout_ns) {
  if (nbytes > t.capacity() || !directSupports(dtype, op))
    throw Error(ErrorKind::kInvalid, "direct all_reduce called outside its limits");
  DirectArgs a{};
  a.peers = t.peers();
  a.data = static_cast<char*>(data);
  a.nbytes = nbytes;
  a.capacity = t.capacity();
  a.timeout_ns = timeout_ns;
  a.err = t.errorForDevice();
  a.rank = t.rank();
  a.world = t.world();
  // NOTE: the grid depends on nbytes only, so every rank's block b covers the same vectors
  // and waits on the same flags. Few blocks: ranks that share a GPU must all fit on it at once.
  const uint64_t nvec = (nbytes + 15) / 16;
  const int blocks = static_cast<int>(std::clamp<uint64_t>((nvec + 4 * kThreads - 1) / (4 * kThreads), 1, kMaxBlocks));
  a.seq = t.nextSeq(blocks);
  if (algo == DirectAlgo::kOneShot) {
    launchOneShot(a, blocks, dtype, op, stream);
  } else {
    launchTwoShot(a, blocks, dtype, op, stream);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(ErrorKind::kSystem, std::string("direct all_reduce launch: ") + cudaGetErrorString(e));
  return a.seq;
}

}  // namespace tilecomm::cuda

// Host side of the direct all-reduce kernels: checks, arguments, grid size.
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

uint64_t allReduceDirect(DirectAlgo algo, PeerTransport& t, void* data, uint64_t nbytes, DType dtype, RedOp op,
                         cudaStream_t stream, uint64_t timeout_ns) {
  const bool ll = algo == DirectAlgo::kOneShotLL;
  if (nbytes > (ll ? t.llCapacity() : t.capacity()) || !directSupports(dtype, op))
    throw Error(ErrorKind::kInvalid, "direct all_reduce called outside its limits");
  DirectArgs a{};
  beginCall(a, t, timeout_ns, ll ? KernelKind::kAllReduceLL : KernelKind::kAllReduce);
  a.data = static_cast<char*>(data);
  a.nbytes = nbytes;
  // NOTE: the grid depends on nbytes, the world and the group's budget and memory only, so every
  // rank's block b covers the same vectors and waits on the same flags; the budget keeps all
  // ranks' kernels resident at once (Note [Block budget]; the simple kernels' threads move
  // kUnroll vectors per loop). LL threads carry one vector each (Note [LL grid]).
  const uint64_t nvec = (nbytes + 15) / 16;
  if (ll) {
    launchOneShotLL(a, llGrid(nvec, t.world(), t.blockBudget(), t.memory()), dtype, op, stream);
  } else {
    const int blocks = simpleGrid(nvec, t.blockBudget(), t.memory());  // Note [Simple grid]
    if (algo == DirectAlgo::kOneShot) launchOneShot(a, blocks, dtype, op, stream);
    else launchTwoShot(a, blocks, dtype, op, stream);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(ErrorKind::kSystem, std::string("direct all_reduce launch: ") + cudaGetErrorString(e));
  return a.launch;
}

}  // namespace tilecomm::cuda

// Runtime (dtype, op) -> kernel template instantiation, shared by the direct
// kernels that reduce (all_reduce simple and LL, reduce_scatter). Bitwise ops are
// instantiated for integer types only.
#pragma once

#include "cuda/primitives.cuh"

namespace tilecomm::cuda {

// `grid`: what Algo::launch takes for its grid (the thread blocks, or an LLGrid).
template <typename Algo, typename T, typename Args, typename Grid>
void dispatchOp(const Args& a, const Grid& blocks, RedOp op, cudaStream_t s) {
  switch (op) {
    case RedOp::kSum: return Algo::template launch<T, RedOp::kSum>(a, blocks, s);
    case RedOp::kProduct: return Algo::template launch<T, RedOp::kProduct>(a, blocks, s);
    case RedOp::kMin: return Algo::template launch<T, RedOp::kMin>(a, blocks, s);
    case RedOp::kMax: return Algo::template launch<T, RedOp::kMax>(a, blocks, s);
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case RedOp::kBand: return Algo::template launch<T, RedOp::kBand>(a, blocks, s);
      case RedOp::kBor: return Algo::template launch<T, RedOp::kBor>(a, blocks, s);
      case RedOp::kBxor: return Algo::template launch<T, RedOp::kBxor>(a, blocks, s);
      default: break;
    }
  }
}

template <typename Algo, typename Args, typename Grid>
void dispatch(const Args& a, const Grid& blocks, DType dtype, RedOp op, cudaStream_t s) {
  switch (dtype) {
    case DType::kFloat16: return dispatchOp<Algo, __half>(a, blocks, op, s);
    case DType::kBFloat16: return dispatchOp<Algo, __nv_bfloat16>(a, blocks, op, s);
    case DType::kFloat32: return dispatchOp<Algo, float>(a, blocks, op, s);
    case DType::kFloat64: return dispatchOp<Algo, double>(a, blocks, op, s);
    case DType::kInt8: return dispatchOp<Algo, int8_t>(a, blocks, op, s);
    case DType::kUInt8: return dispatchOp<Algo, uint8_t>(a, blocks, op, s);
    case DType::kInt16: return dispatchOp<Algo, int16_t>(a, blocks, op, s);
    case DType::kInt32: return dispatchOp<Algo, int32_t>(a, blocks, op, s);
    case DType::kInt64: return dispatchOp<Algo, int64_t>(a, blocks, op, s);
    case DType::kBool: return dispatchOp<Algo, bool>(a, blocks, op, s);
    default: break;
  }
}

void launchOneShot(const DirectArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s);
void launchTwoShot(const DirectArgs& a, int blocks, DType dtype, RedOp op, cudaStream_t s);
void launchOneShotLL(const DirectArgs& a, const LLGrid& grid, DType dtype, RedOp op, cudaStream_t s);

}  // namespace tilecomm::cuda

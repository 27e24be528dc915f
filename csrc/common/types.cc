#include "common/types.h"

#include <sstream>

namespace tilecomm {

size_t dtypeSize(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
    case DType::kComplex64:
      return 8;
    case DType::kComplex128:
      return 16;
    default:
      return 1;
  }
}

const char* dtypeName(DType t) {
  static const char* kNames[] = {"float16", "bfloat16", "float32", "float64",   "int8",       "uint8", "int16",
                                 "int32",   "int64",    "bool",    "complex64", "complex128", "bytes"};
  return t < DType::kCount ? kNames[static_cast<int>(t)] : "?";
}

const char* redOpName(RedOp op) {
  static const char* kNames[] = {"sum", "product", "min", "max", "band", "bor", "bxor", "none"};
  return op < RedOp::kCount ? kNames[static_cast<int>(op)] : "?";
}

const char* collName(Coll c) {
  static const char* kNames[] = {"all_reduce", "broadcast",  "reduce",     "all_gather", "reduce_scatter",
                                 "gather",     "scatter",    "all_to_all", "barrier"};
  return c < Coll::kCount ? kNames[static_cast<int>(c)] : "?";
}

std::string CollDesc::describe() const {
  std::ostringstream s;
  s << collName(coll) << "(";
  const char* sep = "";
  if (op != RedOp::kNone) {
    s << redOpName(op);
    sep = ", ";
  }
  if (root >= 0) {
    s << sep << "root=" << root;
    sep = ", ";
  }
  if (coll != Coll::kBarrier) s << sep << count << " x " << dtypeName(dtype);
  s << ")";
  return s.str();
}

}  // namespace tilecomm

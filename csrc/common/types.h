// Engine-wide vocabulary: element types, reduction ops, collective kinds and the
// descriptor every message carries so that ranks can check they agree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tilecomm {

/// Element types the engine can move and reduce. Values are part of the wire
/// descriptor, so they never change meaning.
enum class DType : uint8_t {
  kFloat16 = 0,
  kBFloat16,
  kFloat32,
  kFloat64,
  kInt8,
  kUInt8,
  kInt16,
  kInt32,
  kInt64,
  kBool,
  kComplex64,
  kComplex128,
  kBytes,  // opaque bytes: moved, never reduced
  kCount,
};

/// Reductions applied element-wise by the engine. AVG and PREMUL_SUM are
/// SUM plus a scaling done by the backend before or after.
enum class RedOp : uint8_t { kSum = 0, kProduct, kMin, kMax, kBand, kBor, kBxor, kNone, kCount };

/// Collective kinds; part of the descriptor for desync diagnostics.
enum class Coll : uint8_t {
  kAllReduce = 0,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kGather,
  kScatter,
  kAllToAll,
  kBarrier,
  kCount,
};

size_t dtypeSize(DType t);
const char* dtypeName(DType t);
const char* redOpName(RedOp op);
const char* collName(Coll c);

/// What one collective call looks like from one rank. Every message of the
/// collective carries it; a receiver whose own descriptor differs reports a
/// desync that names both sides.
struct CollDesc {
  uint64_t seq = 0;    // per-group collective sequence number, from 1
  uint64_t count = 0;  // elements that must agree across ranks (0 when sizes may differ)
  int32_t root = -1;
  uint16_t algo = 0;
  Coll coll = Coll::kAllReduce;
  DType dtype = DType::kBytes;
  RedOp op = RedOp::kNone;
  uint8_t pad_[3] = {0, 0, 0};

  bool sameCall(const CollDesc& o) const {
    return seq == o.seq && count == o.count && root == o.root && algo == o.algo && coll == o.coll &&
           dtype == o.dtype && op == o.op;
  }
  /// e.g. "all_reduce(sum, 1024 x float32)" (algorithm names are resolved by the caller).
  std::string describe() const;
};
static_assert(sizeof(CollDesc) == 32, "CollDesc is part of the shared-memory layout");

}  // namespace tilecomm

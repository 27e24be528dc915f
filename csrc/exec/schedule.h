// A schedule is data: rounds of steps over the chunks of one buffer. Chunks
// are fractions of the buffer (chunk c covers elements [c*n/C, (c+1)*n/C)), so
// one schedule serves every message size. Schedules are generated per group
// by the Python algorithm registry and handed down once at group creation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/types.h"
#include "exec/executor.h"

namespace tilecomm::exec {

struct SchedOp {
  StepKind kind;
  int32_t peer;     // group rank (rooted algorithms: relative to the root)
  uint32_t lo, hi;  // chunk range [lo, hi)
  int32_t dep;      // index within the round of the step this one is bounded by, or -1
};

struct Schedule {
  uint32_t nchunks = 1;
  std::vector<uint32_t> round_end;  // ops of round k are [round_end[k-1], round_end[k])
  std::vector<SchedOp> ops;
};

struct Algorithm {
  uint16_t id = 0;
  std::string name;
  Coll coll = Coll::kAllReduce;
  bool rooted = false;
  bool direct = false;  // run by the engine itself (csrc/algorithms/), no schedule
  // Not rooted: one schedule, this rank's. Rooted: one per rank relative to the
  // root ("vrank" = (rank - root) mod p), generated for root 0 and rotated.
  std::vector<Schedule> schedules;
};

/// Byte offset of the start of chunk c when `count` elements of `elem` bytes are cut into `nchunks`.
inline size_t chunkOffset(uint64_t c, uint64_t nchunks, uint64_t count, size_t elem) {
  return static_cast<size_t>((static_cast<unsigned __int128>(c) * count) / nchunks) * elem;
}

}  // namespace tilecomm::exec

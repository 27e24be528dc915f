// Direct algorithms: run by the engine itself rather than from a schedule,
// because they end with a local step a schedule cannot express (a reduction of
// received blocks in rank order). Each lives in its own file; its cost terms are
// declared next to its Python registration (python/tilecomm/algorithms/<id>.py).
#pragma once

#include <string>
#include <vector>

#include "exec/executor.h"

namespace tilecomm::algo {

struct DirectArgs {
  exec::Executor& exec;
  int rank;
  int world;
  char* buf;       // the collective's buffer (see the engine's buffer conventions)
  uint64_t count;  // elements in buf
  DType dtype;
  RedOp op;
  const CollDesc& desc;
  exec::Clock::time_point deadline;
  int64_t timeout_ms;
  std::vector<char>& scratch;  // reused across calls
};

using DirectFn = void (*)(const DirectArgs&);

/// The direct algorithm registered under `name`, or nullptr.
DirectFn findDirect(const std::string& name);

/// An all-to-all over explicit byte ranges: block r of `in` goes to rank r,
/// block r of `out` comes from rank r (block sizes may differ per rank).
struct AllToAllArgs {
  exec::Executor& exec;
  int rank;
  int world;
  const char* in;
  const std::vector<size_t>& in_off;
  const std::vector<size_t>& in_len;
  char* out;
  const std::vector<size_t>& out_off;
  const std::vector<size_t>& out_len;
  const CollDesc& desc;
  exec::Clock::time_point deadline;
  int64_t timeout_ms;
};

using AllToAllFn = void (*)(const AllToAllArgs&);

/// The all-to-all algorithm registered under `name`, or nullptr.
AllToAllFn findAllToAll(const std::string& name);

/// Shared by the all-to-all algorithms: the own block is a local copy, and the
/// exchange at distance k sends block r+k to rank r+k and receives rank r-k's.
void copyOwnBlock(const AllToAllArgs& a);
void addExchange(const AllToAllArgs& a, int k, std::vector<exec::Step>& steps);

void alltoallPairwise(const AllToAllArgs& a);
void alltoallDirect(const AllToAllArgs& a);

void allreduceOneShot(const DirectArgs& a);
void allreduceTwoShot(const DirectArgs& a);
void reducescatterDirect(const DirectArgs& a);

/// Shared by two_shot and reducescatter_direct: with buf cut into `world`
/// chunks, send chunk j to rank j and leave in chunk `rank` the reduction of
/// every rank's chunk `rank`, combined in rank order 0, 1, .., p-1.
void scatterReduce(const DirectArgs& a);

}  // namespace tilecomm::algo

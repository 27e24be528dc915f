// Direct all-to-all: one round in which every rank sends each peer its block
// and receives every peer's block at once; the own block is a local copy.
// Cost: 1 round, (p-1)/p of the buffer sent per rank, nothing reduced
// (declared in python/tilecomm/algorithms/alltoall_direct.py). Fewer rounds
// than pairwise, at the price of every rank serving p-1 peers at the same time.
#include <algorithm>

#include "algorithms/direct.h"

namespace tilecomm::algo {

void alltoallDirect(const AllToAllArgs& a) {
  std::copy(a.in + a.in_off[a.rank], a.in + a.in_off[a.rank] + a.in_len[a.rank], a.out + a.out_off[a.rank]);
  std::vector<exec::Step> steps;
  for (int k = 1; k < a.world; ++k) {
    int to = (a.rank + k) % a.world, from = (a.rank - k + a.world) % a.world;
    steps.push_back(exec::Step{exec::StepKind::kSend, to, const_cast<char*>(a.in) + a.in_off[to], a.in_len[to], -1});
    steps.push_back(exec::Step{exec::StepKind::kRecvCopy, from, a.out + a.out_off[from], a.out_len[from], -1});
  }
  if (!steps.empty()) a.exec.runRound(steps, a.desc, DType::kBytes, RedOp::kNone, a.deadline, a.timeout_ms);
}

}  // namespace tilecomm::algo

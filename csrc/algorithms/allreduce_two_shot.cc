// Two-shot all-reduce: a direct reduce-scatter (chunk j goes straight to rank
// j, which combines the p copies in rank order), then a direct all-gather of the
// reduced chunks. Cost: 2 rounds, 2(p-1)/p of the buffer sent and (p-1)/p
// reduced per rank. Each chunk is reduced once, by its owner, then copied, so
// all ranks end bitwise identical. Between one_shot (small) and ring (large).
#include "algorithms/direct.h"
#include "exec/schedule.h"

namespace tilecomm::algo {

void allreduceTwoShot(const DirectArgs& a) {
  scatterReduce(a);
  const size_t elem = dtypeSize(a.dtype);
  auto off = [&](int c) { return exec::chunkOffset(c, a.world, a.count, elem); };
  std::vector<exec::Step> steps;
  // round: our reduced chunk to every peer; every peer's reduced chunk into place.
  for (int k = 1; k < a.world; ++k) {
    int to = (a.rank + k) % a.world, from = (a.rank - k + a.world) % a.world;
    steps.push_back(exec::Step{exec::StepKind::kSend, to, a.buf + off(a.rank), off(a.rank + 1) - off(a.rank), -1});
    steps.push_back(exec::Step{exec::StepKind::kRecvCopy, from, a.buf + off(from), off(from + 1) - off(from), -1});
  }
  a.exec.runRound(steps, a.desc, a.dtype, a.op, a.deadline, a.timeout_ms);
}

}  // namespace tilecomm::algo

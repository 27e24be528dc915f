// One-shot all-reduce: every rank sends its whole buffer to every peer in one
// round, then combines the p contributions locally in rank order (0, 1, ..,
// p-1), so every rank computes the same expression and ends bitwise identical.
// Cost: 1 round, (p-1) x the buffer sent and reduced per rank. Wins for small
// messages: a single exchange, nobody waits on a chain of partners.
#include <cstring>

#include "algorithms/direct.h"
#include "kernels/reduce.h"

namespace tilecomm::algo {

void allreduceOneShot(const DirectArgs& a) {
  const size_t nbytes = a.count * dtypeSize(a.dtype);
  a.scratch.resize(nbytes * a.world);
  char* slots = a.scratch.data();
  std::vector<exec::Step> steps;
  // round: the buffer to every peer; every peer's buffer into its slot.
  for (int k = 1; k < a.world; ++k) {
    int to = (a.rank + k) % a.world, from = (a.rank - k + a.world) % a.world;
    steps.push_back(exec::Step{exec::StepKind::kSend, to, a.buf, nbytes, -1});
    steps.push_back(exec::Step{exec::StepKind::kRecvCopy, from, slots + from * nbytes, nbytes, -1});
  }
  a.exec.runRound(steps, a.desc, a.dtype, a.op, a.deadline, a.timeout_ms);
  std::memcpy(slots + a.rank * nbytes, a.buf, nbytes);
  std::memcpy(a.buf, slots, nbytes);
  for (int r = 1; r < a.world; ++r) kernels::reduceInto(a.buf, slots + r * nbytes, a.count, a.dtype, a.op);
}

}  // namespace tilecomm::algo

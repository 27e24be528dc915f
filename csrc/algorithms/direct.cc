// Registration of the direct algorithms and the scatter-reduce step they share.
#include "algorithms/direct.h"

#include <cstring>

#include "exec/schedule.h"
#include "kernels/reduce.h"

namespace tilecomm::algo {

DirectFn findDirect(const std::string& name) {
  if (name == "allreduce_one_shot") return &allreduceOneShot;
  if (name == "allreduce_two_shot") return &allreduceTwoShot;
  if (name == "reducescatter_direct") return &reducescatterDirect;
  return nullptr;
}

AllToAllFn findAllToAll(const std::string& name) {
  if (name == "alltoall_pairwise") return &alltoallPairwise;
  if (name == "alltoall_direct") return &alltoallDirect;
  return nullptr;
}

void copyOwnBlock(const AllToAllArgs& a) {
  std::memcpy(a.out + a.out_off[a.rank], a.in + a.in_off[a.rank], a.in_len[a.rank]);
}

void addExchange(const AllToAllArgs& a, int k, std::vector<exec::Step>& steps) {
  int to = (a.rank + k) % a.world, from = (a.rank - k + a.world) % a.world;
  steps.push_back(exec::Step{exec::StepKind::kSend, to, const_cast<char*>(a.in) + a.in_off[to], a.in_len[to], -1});
  steps.push_back(exec::Step{exec::StepKind::kRecvCopy, from, a.out + a.out_off[from], a.out_len[from], -1});
}

void scatterReduce(const DirectArgs& a) {
  const size_t elem = dtypeSize(a.dtype);
  auto off = [&](int c) { return exec::chunkOffset(c, a.world, a.count, elem); };
  const size_t mine = off(a.rank + 1) - off(a.rank);
  a.scratch.resize(mine * a.world);
  char* slots = a.scratch.data();
  std::vector<exec::Step> steps;
  // round: chunk j to rank j; every rank's copy of our chunk into its slot.
  for (int k = 1; k < a.world; ++k) {
    int to = (a.rank + k) % a.world, from = (a.rank - k + a.world) % a.world;
    steps.push_back(exec::Step{exec::StepKind::kSend, to, a.buf + off(to), off(to + 1) - off(to), -1});
    steps.push_back(exec::Step{exec::StepKind::kRecvCopy, from, slots + from * mine, mine, -1});
  }
  a.exec.runRound(steps, a.desc, a.dtype, a.op, a.deadline, a.timeout_ms);
  char* out = a.buf + off(a.rank);
  std::memcpy(slots + a.rank * mine, out, mine);
  // Combine in rank order: ((x0 op x1) op x2) ..
  std::memcpy(out, slots, mine);
  for (int r = 1; r < a.world; ++r) kernels::reduceInto(out, slots + r * mine, mine / elem, a.dtype, a.op);
}

}  // namespace tilecomm::algo

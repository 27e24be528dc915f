// Pairwise all-to-all, run directly (block sizes vary per call, so there is no
// fixed schedule). Round k = 1..p-1: send the block for rank r+k, receive the
// block of rank r-k; the own block is a local copy. Cost: p-1 rounds, (p-1)/p of
// the buffer sent per rank, nothing reduced (declared in
// python/tilecomm/algorithms/alltoall_pairwise.py). Each round pairs distinct
// partners, so no rank is flooded.
#include <algorithm>

#include "exec/engine.h"

namespace tilecomm::exec {

void Engine::allToAll(const char* in, const std::vector<size_t>& in_off, const std::vector<size_t>& in_len,
                      char* out, const std::vector<size_t>& out_off, const std::vector<size_t>& out_len,
                      int64_t timeout_ms) {
  exec_->checkAborted();
  CollDesc desc;
  desc.seq = ++coll_seq_;
  desc.coll = Coll::kAllToAll;
  desc.dtype = DType::kBytes;
  desc.algo = alltoall_id_;
  shm_->publishBoard(desc);
  int64_t timeout = timeout_ms > 0 ? timeout_ms : cfg_.timeout_ms;
  Clock::time_point dl = deadline(timeout);
  std::copy(in + in_off[rank_], in + in_off[rank_] + in_len[rank_], out + out_off[rank_]);
  // round k: send block (r + k) to rank r + k, receive block (r - k) from rank r - k.
  for (int k = 1; k < world_; ++k) {
    int to = (rank_ + k) % world_, from = (rank_ - k + world_) % world_;
    steps_.clear();
    steps_.push_back(Step{StepKind::kSend, to, const_cast<char*>(in) + in_off[to], in_len[to], -1});
    steps_.push_back(Step{StepKind::kRecvCopy, from, out + out_off[from], out_len[from], -1});
    exec_->runRound(steps_, desc, DType::kBytes, RedOp::kNone, dl, timeout);
  }
}

}  // namespace tilecomm::exec

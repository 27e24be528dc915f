#include "exec/executor.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "kernels/reduce.h"

namespace tilecomm::exec {

using transport::kCollLane;
using transport::ShmTransport;
using transport::Slot;

void Executor::begin(const CollDesc& d) {
  history_[d.seq % kHistory] = d;
  tr_.publishBoard(d);
  // Every earlier collective is done on this rank, so a message of one still
  // waiting means a peer called something else (say, another root) that only we
  // can notice: fail before sending anything, so that no peer completes this one.
  checkInbox(d, d.seq - 1);
}

void Executor::checkPrevious(const CollDesc& desc, int peer) const {
  if (desc.seq < 2) return;
  const CollDesc& ours = history_[(desc.seq - 1) % kHistory];
  std::optional<transport::BoardEntry> theirs = tr_.readBoardAt(peer, desc.seq - 1);
  if (ours.seq == desc.seq - 1 && theirs && !theirs->desc.sameCall(ours))
    throw Error(ErrorKind::kDesync, desyncMessage(tr_.rank(), ours, peer, theirs->desc));
}

void Executor::checkInbox(const CollDesc& desc, uint64_t upto) const {
  for (int r = 0; r < tr_.world(); ++r) {
    if (r == tr_.rank()) continue;
    const Slot* stale = tr_.tryRecvSlot(kCollLane, r);
    if (stale) {
      const CollDesc theirs = stale->hdr.desc;  // copy once: the peer could scribble on shared memory
      if (theirs.seq <= upto) throw Error(ErrorKind::kDesync, mismatch(desc, r, theirs));
    }
  }
}

std::string Executor::mismatch(const CollDesc& mine, int peer, const CollDesc& theirs) const {
  // A rank that only sent in collective #k learns of a mismatch in a later call:
  // compare what both called as #k (ours from our history, a peer that is ahead
  // from its board).
  const CollDesc& ours_then = history_[theirs.seq % kHistory];
  if (theirs.seq < mine.seq && ours_then.seq == theirs.seq && !ours_then.sameCall(theirs))
    return desyncMessage(tr_.rank(), ours_then, peer, theirs);
  if (theirs.seq > mine.seq)
    if (std::optional<transport::BoardEntry> then = tr_.readBoardAt(peer, mine.seq))
      if (!then->desc.sameCall(mine)) return desyncMessage(tr_.rank(), mine, peer, then->desc);
  return desyncMessage(tr_.rank(), mine, peer, theirs);
}

std::string desyncMessage(int me, const CollDesc& mine, int peer, const CollDesc& theirs) {
  std::string a = mine.describe(), b = theirs.describe();
  if (a == b && mine.algo != theirs.algo) {
    a += " with algorithm #" + std::to_string(mine.algo);
    b += " with algorithm #" + std::to_string(theirs.algo);
  }
  return "collective mismatch: rank " + std::to_string(peer) + " called " + b + " as collective #" +
         std::to_string(theirs.seq) + ", rank " + std::to_string(me) + " called " + a + " as collective #" +
         std::to_string(mine.seq);
}

bool Executor::progressSend(Step& s, std::vector<Step>& steps, const CollDesc& desc) {
  const size_t slice = tr_.slotBytes(s.peer);
  size_t limit = s.dep >= 0 ? steps[s.dep].done : s.nbytes;
  bool moved = false;
  while (!s.finished) {
    size_t len = std::min(slice, s.nbytes - s.done);
    if (s.done + len > limit && len > 0) break;
    Slot* slot = tr_.trySendSlot(kCollLane, s.peer);
    if (!slot) break;
    slot->hdr.desc = desc;
    slot->hdr.msg_bytes = s.nbytes;
    slot->hdr.offset = s.done;
    slot->hdr.len = static_cast<uint32_t>(len);
    slot->hdr.tag = 0;
    slot->hdr.p2p_seq = 0;
    std::memcpy(ShmTransport::payload(slot), s.ptr + s.done, len);
    tr_.commitSend(kCollLane, s.peer, len);
    s.done += len;
    s.finished = s.done == s.nbytes;  // a zero-byte message still sends one (empty) slot
    moved = true;
  }
  return moved;
}

bool Executor::progressRecv(Step& s, std::vector<Step>& steps, const CollDesc& desc, DType dtype, RedOp op) {
  const size_t slice = tr_.slotBytes(s.peer);
  bool moved = false;
  while (!s.finished) {
    size_t len = std::min(slice, s.nbytes - s.done);
    // NOTE: a receive-reduce that shares bytes with a send must not overwrite them before they are sent.
    if (s.dep >= 0 && len > 0 && steps[s.dep].done < s.done + len) break;
    const Slot* slot = tr_.tryRecvSlot(kCollLane, s.peer);
    if (!slot) break;
    const transport::SlotHeader h = slot->hdr;  // copy once: the peer could scribble on shared memory
    if (!h.desc.sameCall(desc)) throw Error(ErrorKind::kDesync, mismatch(desc, s.peer, h.desc));
    if (s.done == 0) checkPrevious(desc, s.peer);
    if (h.msg_bytes != s.nbytes || h.offset != s.done || h.len != len)
      throw Error(ErrorKind::kDesync,
                  "in " + desc.describe() + " (collective #" + std::to_string(desc.seq) + ") rank " +
                      std::to_string(s.peer) + " sent a " + std::to_string(h.msg_bytes) + "-byte message at offset " +
                      std::to_string(h.offset) + " where rank " + std::to_string(tr_.rank()) + " expected " +
                      std::to_string(s.nbytes) + " bytes at offset " + std::to_string(s.done));
    const char* src = ShmTransport::payload(slot);
    if (s.kind == StepKind::kRecvCopy) {
      std::memcpy(s.ptr + s.done, src, len);
    } else {
      kernels::reduceInto(s.ptr + s.done, src, len / dtypeSize(dtype), dtype, op);
    }
    tr_.releaseRecv(kCollLane, s.peer, len);
    s.done += len;
    s.finished = s.done == s.nbytes;
    moved = true;
  }
  return moved;
}

void Executor::runRound(std::vector<Step>& steps, const CollDesc& desc, DType dtype, RedOp op,
                        Clock::time_point deadline, int64_t timeout_ms) {
  drive(
      [&](std::vector<int>& waiting) {
        bool moved = false;
        for (Step& s : steps) {
          if (s.finished) continue;
          moved |= s.kind == StepKind::kSend ? progressSend(s, steps, desc) : progressRecv(s, steps, desc, dtype, op);
          if (!s.finished) waiting.push_back(s.peer);
        }
        return moved;
      },
      &desc, nullptr, deadline, timeout_ms);
}

uint64_t Executor::exchangeMailbox(const CollDesc& desc, const char* data, size_t len, uint64_t offset,
                                   uint64_t msg_bytes, Clock::time_point deadline, int64_t timeout_ms) {
  const uint64_t round = ++mailbox_round_;
  const int me = tr_.rank(), world = tr_.world();
  if (!tr_.mailboxes()) {  // some peers are not in shared memory: exchange the pieces
    exchanged_.resize(len * world);
    if (len) std::memcpy(exchanged_.data() + me * len, data, len);
    exchange_steps_.clear();
    for (int k = 1; k < world; ++k) {
      int to = (me + k) % world, from = (me - k + world) % world;
      exchange_steps_.push_back(Step{StepKind::kSend, to, const_cast<char*>(data), len, -1});
      exchange_steps_.push_back(Step{StepKind::kRecvCopy, from, exchanged_.data() + from * len, len, -1});
    }
    runRound(exchange_steps_, desc, DType::kBytes, RedOp::kNone, deadline, timeout_ms);
    return round;
  }
  ShmTransport& shm = tr_.shm();
  Slot* box = shm.mailbox(me, round);
  box->hdr.desc = desc;
  box->hdr.msg_bytes = msg_bytes;
  box->hdr.offset = offset;
  box->hdr.len = static_cast<uint32_t>(len);
  box->hdr.tag = 0;
  box->hdr.p2p_seq = 0;
  std::memcpy(ShmTransport::payload(box), data, len);
  shm.arrive(round);
  tr_.countMailbox(true, len);
  drive(
      [&](std::vector<int>& waiting) {
        if (shm.allArrived(round)) return true;
        for (int r = 0; r < world; ++r)
          if (r != me && shm.mailbox(r, round)->seq.load(std::memory_order_acquire) != round) waiting.push_back(r);
        // NOTE: every rank may have posted while the counter is still behind;
        // wait on anyone then, the counter moves next.
        if (waiting.empty()) waiting.push_back(me == 0 ? 1 : 0);
        return false;
      },
      &desc, nullptr, deadline, timeout_ms);
  // NOTE: a mailbox collective sends no slots, and once every rank arrived every
  // message of earlier collectives has landed: a pending slot of this or an
  // earlier collective means some ranks called something else.
  checkInbox(desc, desc.seq);
  for (int r = 0; r < world; ++r)
    if (r != me) checkPrevious(desc, r);
  return round;
}

const char* Executor::peerMailbox(int peer, uint64_t round, const CollDesc& desc, size_t len, uint64_t offset,
                                  uint64_t msg_bytes) {
  // An exchange round checked every piece's descriptor and size as it arrived.
  if (!tr_.mailboxes()) return exchanged_.data() + peer * len;
  const Slot* box = tr_.shm().mailbox(peer, round);
  const transport::SlotHeader h = box->hdr;  // copy once: the peer could scribble on shared memory
  if (!h.desc.sameCall(desc)) throw Error(ErrorKind::kDesync, mismatch(desc, peer, h.desc));
  if (box->seq.load(std::memory_order_acquire) != round || h.msg_bytes != msg_bytes || h.offset != offset ||
      h.len != len)
    throw Error(ErrorKind::kDesync,
                "in " + desc.describe() + " (collective #" + std::to_string(desc.seq) + ") rank " +
                    std::to_string(peer) + " posted " + std::to_string(h.len) + " bytes at offset " +
                    std::to_string(h.offset) + " of a " + std::to_string(h.msg_bytes) + "-byte message where rank " +
                    std::to_string(tr_.rank()) + " expected " + std::to_string(len) + " bytes at offset " +
                    std::to_string(offset) + " of " + std::to_string(msg_bytes));
  if (peer != tr_.rank()) tr_.countMailbox(false, len);
  return ShmTransport::payload(box);
}

void Executor::checkAborted() const {
  if (stop_.load(std::memory_order_acquire)) throw Error(ErrorKind::kAborted, "the process group was destroyed");
  if (int a = tr_.abortedBy())
    throw Error(ErrorKind::kAborted, "rank " + std::to_string(a - 1) + " failed: " + tr_.peerError(a - 1));
}

void Executor::checkFailures(const WaitScope& scope) {
  int me = tr_.rank();
  tr_.heartbeat();
  if (scope.desc) tr_.announceBoard(*scope.desc);
  checkAborted();
  std::string where = scope.desc ? scope.desc->describe() + " (collective #" + std::to_string(scope.desc->seq) + ")"
                                 : std::string("point-to-point ") + scope.what;
  bool any = std::find(scope.peers->begin(), scope.peers->end(), -1) != scope.peers->end();
  const int lane = scope.desc ? transport::kCollLane : transport::kP2PLane;
  int dead = -1;
  if (any) {
    dead = tr_.lastPeerIfAllGone(lane);
  } else {
    for (int p : *scope.peers)
      if (dead < 0 && tr_.peerGone(p, lane)) dead = p;
  }
  if (dead >= 0) {
    throw Error(ErrorKind::kPeerFailed, (any ? std::string("every other rank is gone; the last seen: ") : std::string()) +
                                            tr_.deathNote(dead) + " while rank " + std::to_string(me) +
                                            " was waiting for it in " + where);
  }
  if (scope.desc) {
    for (int p : *scope.peers) {
      std::optional<transport::BoardEntry> b = tr_.reportedBoard(p);
      if (b && b->seq == scope.desc->seq && !b->desc.sameCall(*scope.desc))
        throw Error(ErrorKind::kDesync, mismatch(*scope.desc, p, b->desc));
    }
  }
  if (Clock::now() >= scope.deadline) throw Error(ErrorKind::kTimeout, timeoutMessage(scope, where));
}

std::string Executor::timeoutMessage(const WaitScope& scope, const std::string& where) const {
  int me = tr_.rank();
  std::string msg = "timed out after " + std::to_string(scope.timeout_ms) + " ms in " + where + " on rank " +
                    std::to_string(me);
  if (scope.desc) {
    // The ranks that never reached this collective are the ones to name, even
    // when we wait for them only through a neighbour.
    std::string behind;
    for (int r = 0; r < tr_.world(); ++r) {
      if (r == me) continue;
      std::optional<transport::BoardEntry> b = tr_.readBoard(r);  // peers over TCP cannot be read
      if (!b || b->seq >= scope.desc->seq) continue;
      behind += "; rank " + std::to_string(r) +
                (b->seq == 0 ? std::string(" has not started any collective")
                             : " never reached it (last started collective #" + std::to_string(b->seq) + " " +
                                   b->desc.describe() + ")");
    }
    if (!behind.empty()) return msg + behind;
    // Ranks inside this collective that stopped running (SIGSTOP, a debugger,
    // starved of CPU) hold up their neighbours, and through them us.
    const int64_t stalled_ns = std::max<int64_t>(1000000000, 50 * wc_.sleep_us * 1000);
    for (int r = 0; r < tr_.world(); ++r) {
      std::optional<transport::BoardEntry> b = r == me ? std::nullopt : tr_.readBoard(r);
      std::optional<int64_t> idle = b && b->seq == scope.desc->seq ? tr_.idleNs(r) : std::nullopt;
      if (idle && *idle > stalled_ns)
        msg += "; rank " + std::to_string(r) + " is in it but has not run for " + std::to_string(*idle / 1000000) +
               " ms (stopped or starved of CPU);";
    }
  }
  std::vector<int> peers = *scope.peers;
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  std::string names;
  for (int p : peers) names += (names.empty() ? "" : ", ") + (p < 0 ? std::string("any rank") : std::to_string(p));
  return msg + " waiting for rank " + names;
}

void Executor::sleepOnDoorbell(uint32_t token, Clock::time_point deadline) {
  int64_t left_us = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
  tr_.sleep(token, std::max<int64_t>(1, std::min(left_us, wc_.sleep_us)));
}

}  // namespace tilecomm::exec

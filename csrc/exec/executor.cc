#include "exec/executor.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "kernels/reduce.h"

namespace tilecomm::exec {

using transport::kCollLane;
using transport::ShmTransport;
using transport::Slot;

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
  const size_t slice = shm_.slotBytes();
  size_t limit = s.dep >= 0 ? steps[s.dep].done : s.nbytes;
  bool moved = false;
  while (!s.finished) {
    size_t len = std::min(slice, s.nbytes - s.done);
    if (s.done + len > limit && len > 0) break;
    Slot* slot = shm_.trySendSlot(kCollLane, s.peer);
    if (!slot) break;
    slot->hdr.desc = desc;
    slot->hdr.msg_bytes = s.nbytes;
    slot->hdr.offset = s.done;
    slot->hdr.len = static_cast<uint32_t>(len);
    slot->hdr.tag = 0;
    slot->hdr.p2p_seq = 0;
    std::memcpy(ShmTransport::payload(slot), s.ptr + s.done, len);
    shm_.commitSend(kCollLane, s.peer);
    s.done += len;
    s.finished = s.done == s.nbytes;  // a zero-byte message still sends one (empty) slot
    moved = true;
  }
  return moved;
}

bool Executor::progressRecv(Step& s, std::vector<Step>& steps, const CollDesc& desc, DType dtype, RedOp op) {
  const size_t slice = shm_.slotBytes();
  bool moved = false;
  while (!s.finished) {
    size_t len = std::min(slice, s.nbytes - s.done);
    // NOTE: a receive-reduce that shares bytes with a send must not overwrite them before they are sent.
    if (s.dep >= 0 && len > 0 && steps[s.dep].done < s.done + len) break;
    const Slot* slot = shm_.tryRecvSlot(kCollLane, s.peer);
    if (!slot) break;
    const transport::SlotHeader h = slot->hdr;  // copy once: the peer could scribble on shared memory
    if (!h.desc.sameCall(desc)) throw Error(ErrorKind::kDesync, desyncMessage(shm_.rank(), desc, s.peer, h.desc));
    if (h.msg_bytes != s.nbytes || h.offset != s.done || h.len != len)
      throw Error(ErrorKind::kDesync,
                  "in " + desc.describe() + " (collective #" + std::to_string(desc.seq) + ") rank " +
                      std::to_string(s.peer) + " sent a " + std::to_string(h.msg_bytes) + "-byte message at offset " +
                      std::to_string(h.offset) + " where rank " + std::to_string(shm_.rank()) + " expected " +
                      std::to_string(s.nbytes) + " bytes at offset " + std::to_string(s.done));
    const char* src = ShmTransport::payload(slot);
    if (s.kind == StepKind::kRecvCopy) {
      std::memcpy(s.ptr + s.done, src, len);
    } else {
      kernels::reduceInto(s.ptr + s.done, src, len / dtypeSize(dtype), dtype, op);
    }
    shm_.releaseRecv(kCollLane, s.peer);
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
  const int me = shm_.rank();
  Slot* box = shm_.mailbox(me, round);
  box->hdr.desc = desc;
  box->hdr.msg_bytes = msg_bytes;
  box->hdr.offset = offset;
  box->hdr.len = static_cast<uint32_t>(len);
  box->hdr.tag = 0;
  box->hdr.p2p_seq = 0;
  std::memcpy(ShmTransport::payload(box), data, len);
  shm_.arrive(round);
  drive(
      [&](std::vector<int>& waiting) {
        if (shm_.allArrived(round)) return true;
        for (int r = 0; r < shm_.world(); ++r)
          if (r != me && shm_.mailbox(r, round)->seq.load(std::memory_order_acquire) != round) waiting.push_back(r);
        // NOTE: every rank may have posted while the counter is still behind;
        // wait on anyone then, the counter moves next.
        if (waiting.empty()) waiting.push_back(me == 0 ? 1 : 0);
        return false;
      },
      &desc, nullptr, deadline, timeout_ms);
  // NOTE: once every rank has arrived, every message sent in earlier collectives
  // has landed, and a mailbox collective sends none: a pending slot from this or
  // an earlier collective means some ranks called something else (say, another
  // root), which the senders alone could not notice.
  for (int r = 0; r < shm_.world(); ++r) {
    if (r == me) continue;
    const Slot* stale = shm_.tryRecvSlot(kCollLane, r);
    if (stale && stale->hdr.desc.seq <= desc.seq)
      throw Error(ErrorKind::kDesync, desyncMessage(me, desc, r, stale->hdr.desc));
  }
  return round;
}

const char* Executor::peerMailbox(int peer, uint64_t round, const CollDesc& desc, size_t len, uint64_t offset,
                                  uint64_t msg_bytes) const {
  const Slot* box = shm_.mailbox(peer, round);
  const transport::SlotHeader h = box->hdr;  // copy once: the peer could scribble on shared memory
  if (!h.desc.sameCall(desc)) throw Error(ErrorKind::kDesync, desyncMessage(shm_.rank(), desc, peer, h.desc));
  if (box->seq.load(std::memory_order_acquire) != round || h.msg_bytes != msg_bytes || h.offset != offset ||
      h.len != len)
    throw Error(ErrorKind::kDesync,
                "in " + desc.describe() + " (collective #" + std::to_string(desc.seq) + ") rank " +
                    std::to_string(peer) + " posted " + std::to_string(h.len) + " bytes at offset " +
                    std::to_string(h.offset) + " of a " + std::to_string(h.msg_bytes) + "-byte message where rank " +
                    std::to_string(shm_.rank()) + " expected " + std::to_string(len) + " bytes at offset " +
                    std::to_string(offset) + " of " + std::to_string(msg_bytes));
  return ShmTransport::payload(box);
}

void Executor::checkAborted() const {
  if (stop_.load(std::memory_order_acquire)) throw Error(ErrorKind::kAborted, "the process group was destroyed");
  if (int a = shm_.abortedBy())
    throw Error(ErrorKind::kAborted, "rank " + std::to_string(a - 1) + " failed: " + shm_.peerError(a - 1));
}

void Executor::checkFailures(const WaitScope& scope) {
  int me = shm_.rank();
  checkAborted();
  std::string where = scope.desc ? scope.desc->describe() + " (collective #" + std::to_string(scope.desc->seq) + ")"
                                 : std::string("point-to-point ") + scope.what;
  bool any = std::find(scope.peers->begin(), scope.peers->end(), -1) != scope.peers->end();
  int dead = any ? shm_.deadPeer(/*all=*/true) : shm_.deadPeer(false);
  bool waited = any || std::find(scope.peers->begin(), scope.peers->end(), dead) != scope.peers->end();
  if (dead >= 0 && waited) {
    throw Error(ErrorKind::kPeerFailed, (any ? std::string("every other rank has exited; the last seen was rank ")
                                             : std::string("rank ")) +
                                            std::to_string(dead) + " (pid " + std::to_string(shm_.peerPid(dead)) +
                                            ") exited while rank " + std::to_string(me) + " was waiting for it in " +
                                            where);
  }
  if (scope.desc) {
    for (int p : *scope.peers) {
      transport::BoardEntry b = shm_.readBoard(p);
      if (b.seq == scope.desc->seq && !b.desc.sameCall(*scope.desc))
        throw Error(ErrorKind::kDesync, desyncMessage(me, *scope.desc, p, b.desc));
    }
  }
  if (Clock::now() >= scope.deadline) throw Error(ErrorKind::kTimeout, timeoutMessage(scope, where));
}

std::string Executor::timeoutMessage(const WaitScope& scope, const std::string& where) const {
  int me = shm_.rank();
  std::string msg = "timed out after " + std::to_string(scope.timeout_ms) + " ms in " + where + " on rank " +
                    std::to_string(me);
  if (scope.desc) {
    // The ranks that never reached this collective are the ones to name, even
    // when we wait for them only through a neighbour.
    std::string behind;
    for (int r = 0; r < shm_.world(); ++r) {
      if (r == me) continue;
      transport::BoardEntry b = shm_.readBoard(r);
      if (b.seq >= scope.desc->seq) continue;
      behind += "; rank " + std::to_string(r) +
                (b.seq == 0 ? std::string(" has not started any collective")
                            : " never reached it (last started collective #" + std::to_string(b.seq) + " " +
                                  b.desc.describe() + ")");
    }
    if (!behind.empty()) return msg + behind;
  }
  std::string peers;
  for (int p : *scope.peers) peers += (peers.empty() ? "" : ", ") + (p < 0 ? std::string("any rank") : std::to_string(p));
  return msg + " waiting for rank " + peers;
}

void Executor::sleepOnDoorbell(uint32_t token, Clock::time_point deadline) {
  int64_t left_us = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
  shm_.sleep(token, std::max<int64_t>(1, std::min(left_us, wc_.sleep_us)));
}

}  // namespace tilecomm::exec

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

void Executor::checkFailures(const WaitScope& scope) {
  int me = shm_.rank();
  if (int a = shm_.abortedBy()) {
    throw Error(ErrorKind::kAborted, "rank " + std::to_string(a - 1) + " failed: " + shm_.peerError(a - 1));
  }
  std::string where = scope.desc ? scope.desc->describe() + " (collective #" + std::to_string(scope.desc->seq) + ")"
                                 : std::string("point-to-point ") + scope.what;
  int dead = shm_.deadPeer();
  if (dead >= 0 && std::find(scope.peers->begin(), scope.peers->end(), dead) != scope.peers->end()) {
    throw Error(ErrorKind::kPeerFailed, "rank " + std::to_string(dead) + " (pid " +
                                            std::to_string(shm_.peerPid(dead)) + ") exited while rank " +
                                            std::to_string(me) + " was waiting for it in " + where);
  }
  if (scope.desc) {
    for (int p : *scope.peers) {
      transport::BoardEntry b = shm_.readBoard(p);
      if (b.seq == scope.desc->seq && !b.desc.sameCall(*scope.desc))
        throw Error(ErrorKind::kDesync, desyncMessage(me, *scope.desc, p, b.desc));
    }
  }
  if (Clock::now() >= scope.deadline) {
    std::string peers;
    for (int p : *scope.peers) {
      if (!peers.empty()) peers += ", ";
      peers += p < 0 ? std::string("any rank") : std::to_string(p);
    }
    std::string msg = "timed out after " + std::to_string(scope.timeout_ms) + " ms in " + where +
                      " on rank " + std::to_string(me) + " waiting for rank " + peers;
    if (scope.desc && !scope.peers->empty() && scope.peers->front() >= 0) {
      int p = scope.peers->front();
      transport::BoardEntry b = shm_.readBoard(p);
      msg += b.seq == 0 ? "; rank " + std::to_string(p) + " has not started any collective"
                        : "; rank " + std::to_string(p) + " last started collective #" + std::to_string(b.seq) +
                              " " + b.desc.describe();
    }
    throw Error(ErrorKind::kTimeout, msg);
  }
}

void Executor::sleepOnDoorbell(uint32_t token, Clock::time_point deadline) {
  int64_t left_us = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
  shm_.sleep(token, std::max<int64_t>(1, std::min(left_us, wc_.sleep_us)));
}

}  // namespace tilecomm::exec

// Runs rounds of point-to-point steps over the shared-memory transport.
//
// A round is a set of steps that progress concurrently: send a byte range to a
// peer, or receive a byte range from a peer and copy or reduce it into place.
// Steps are cut into slot-sized slices, so one round pipelines through the
// channel ring. A step may depend on another step of the same round over the
// same bytes: a forwarding send advances no further than the receive it
// forwards, and a receive-reduce overwrites no byte its paired send has not
// sent yet.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/types.h"
#include "kernels/wait.h"
#include "transport/shm.h"

namespace tilecomm::exec {

enum class StepKind : uint8_t { kSend, kRecvCopy, kRecvReduce };

struct Step {
  StepKind kind;
  int peer;       // group rank
  char* ptr;      // local bytes to send, or to receive into
  size_t nbytes;  // message size (both sides agree)
  int dep = -1;   // index of the step in the same round this one is bounded by
  // progress, owned by the executor
  size_t done = 0;
  bool finished = false;
};

struct WaitConfig {
  int spins = 64;        // busy polls before yielding
  int yields = 16;       // sched_yield calls before sleeping on the futex
  int64_t sleep_us = 20000;  // longest single sleep; liveness is checked between sleeps
};

using Clock = std::chrono::steady_clock;

/// Why a wait is happening, for error messages.
struct WaitScope {
  const CollDesc* desc;            // collective being run, or nullptr for point-to-point
  const std::vector<int>* peers;   // peers we are waiting on (-1: any peer)
  const char* what;                // e.g. "send to", used for point-to-point
  Clock::time_point deadline;
  int64_t timeout_ms;
};

class Executor {
 public:
  Executor(transport::ShmTransport& shm, const WaitConfig& wc) : shm_(shm), wc_(wc) {}

  /// Runs one round of a collective to completion. Throws tilecomm::Error on
  /// desync, a dead or failed peer, or timeout.
  void runRound(std::vector<Step>& steps, const CollDesc& desc, DType dtype, RedOp op, Clock::time_point deadline,
                int64_t timeout_ms);

  /// A mailbox round (Note [Mailbox] in transport/shm.h): copies `len` bytes,
  /// at `offset` of a `msg_bytes` message, into our mailbox, arrives, and waits
  /// until every rank has. Returns the round for peerMailbox(). Read what you
  /// need before the next round: the buffers are reused.
  uint64_t exchangeMailbox(const CollDesc& desc, const char* data, size_t len, uint64_t offset, uint64_t msg_bytes,
                           Clock::time_point deadline, int64_t timeout_ms);
  /// The payload `peer` (or we) posted in `round`, once checked to be the same
  /// call and the same `len` bytes at `offset` of a `msg_bytes` message.
  const char* peerMailbox(int peer, uint64_t round, const CollDesc& desc, size_t len, uint64_t offset,
                          uint64_t msg_bytes) const;
  /// Most bytes one mailbox round carries.
  size_t mailboxBytes() const { return shm_.slotBytes(); }

  /// Repeats pass(waiting) until it leaves `waiting` empty. A pass makes what
  /// progress it can without blocking, returns whether anything moved, and lists
  /// the peers it still waits on. Between fruitless passes this spins, yields,
  /// then sleeps on the doorbell; it throws if the group was aborted, a
  /// waited-on peer died, a peer is in a different collective, or time is up.
  template <typename Pass>
  void drive(Pass&& pass, const CollDesc* desc, const char* what, Clock::time_point deadline, int64_t timeout_ms);

  /// Makes every current and later wait throw (the group is being destroyed).
  void requestStop() { stop_.store(true, std::memory_order_release); }
  /// Throws if a peer told us the group failed (checked before each collective).
  void checkAborted() const;

  transport::ShmTransport& shm() { return shm_; }
  const WaitConfig& waitConfig() const { return wc_; }

 private:
  bool progressSend(Step& s, std::vector<Step>& steps, const CollDesc& desc);
  bool progressRecv(Step& s, std::vector<Step>& steps, const CollDesc& desc, DType dtype, RedOp op);
  void checkFailures(const WaitScope& scope);
  std::string timeoutMessage(const WaitScope& scope, const std::string& where) const;
  void sleepOnDoorbell(uint32_t token, Clock::time_point deadline);

  transport::ShmTransport& shm_;
  WaitConfig wc_;
  uint64_t mailbox_round_ = 0;  // same on every rank: each round is entered by all
  std::atomic<bool> stop_{false};
};

template <typename Pass>
void Executor::drive(Pass&& pass, const CollDesc* desc, const char* what, Clock::time_point deadline,
                     int64_t timeout_ms) {
  kernels::Backoff backoff(wc_.spins, wc_.yields);
  std::vector<int> waiting;
  for (;;) {
    waiting.clear();
    bool moved = pass(waiting);
    if (waiting.empty()) return;
    if (moved) {
      backoff.reset();
      continue;
    }
    WaitScope scope{desc, &waiting, what, deadline, timeout_ms};
    if (shm_.abortedBy() || stop_.load(std::memory_order_relaxed)) checkFailures(scope);
    if (!backoff.idle()) continue;
    // NOTE: announce before the last pass; a peer that publishes after it sees
    // the announcement and moves the doorbell, so the sleep returns at once.
    uint32_t token = shm_.announce();
    waiting.clear();
    moved = pass(waiting);
    if (!moved && !waiting.empty()) {
      try {
        checkFailures(scope);
      } catch (...) {
        shm_.unannounce();
        throw;
      }
      sleepOnDoorbell(token, deadline);
    }
    shm_.unannounce();
    if (waiting.empty()) return;
    backoff.reset();
  }
}

/// "rank 1 called X as collective #57, rank 0 called Y" (the desync message).
std::string desyncMessage(int me, const CollDesc& mine, int peer, const CollDesc& theirs);

}  // namespace tilecomm::exec

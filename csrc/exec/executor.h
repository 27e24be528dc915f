// Runs rounds of point-to-point steps over the group's transport (shared
// memory, TCP, or both).
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
#include "transport/transport.h"

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
  int64_t spin_ns = 2000;  // busy polling before yielding (Note [Spin by time])
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
  Executor(transport::Transport& tr, const WaitConfig& wc) : tr_(tr), wc_(wc) {}

  /// Runs one round of a collective to completion. Throws tilecomm::Error on
  /// desync, a dead or failed peer, or timeout.
  void runRound(std::vector<Step>& steps, const CollDesc& desc, DType dtype, RedOp op, Clock::time_point deadline,
                int64_t timeout_ms);

  /// A mailbox round (Note [Mailbox] in transport/shm.h): copies `len` bytes,
  /// at `offset` of a `msg_bytes` message, into our mailbox, arrives, and waits
  /// until every rank has. Returns the round for peerMailbox(). Read what you
  /// need before the next round: the buffers are reused. When some peers are
  /// not in shared memory, the round is an exchange of the pieces through
  /// slots instead (same results, p - 1 messages per rank).
  uint64_t exchangeMailbox(const CollDesc& desc, const char* data, size_t len, uint64_t offset, uint64_t msg_bytes,
                           Clock::time_point deadline, int64_t timeout_ms);
  /// The payload `peer` (or we) posted in `round`, once checked to be the same
  /// call and the same `len` bytes at `offset` of a `msg_bytes` message.
  const char* peerMailbox(int peer, uint64_t round, const CollDesc& desc, size_t len, uint64_t offset,
                          uint64_t msg_bytes);
  /// Most bytes one mailbox round carries.
  size_t mailboxBytes() const { return tr_.slotBytes(); }

  /// Repeats pass(waiting) until it leaves `waiting` empty. A pass makes what
  /// progress it can without blocking, returns whether anything moved, and lists
  /// the peers it still waits on. Between fruitless passes this spins, yields,
  /// then sleeps on the doorbell; it throws if the group was aborted, a
  /// waited-on peer died, a peer is in a different collective, or time is up.
  template <typename Pass>
  void drive(Pass&& pass, const CollDesc* desc, const char* what, Clock::time_point deadline, int64_t timeout_ms);

  /// Called as collective `d` starts: publishes it on the board, remembers it
  /// for mismatch messages, and throws if a message of an earlier collective is
  /// still waiting (a mismatch).
  void begin(const CollDesc& d);

  /// Makes every current and later wait throw (the group is being destroyed).
  void requestStop() { stop_.store(true, std::memory_order_release); }
  /// Throws if a peer told us the group failed (checked before each collective).
  void checkAborted() const;

  transport::Transport& transport() { return tr_; }
  const WaitConfig& waitConfig() const { return wc_; }

 private:
  /// The desync message for a peer's descriptor `theirs` met while in `mine`
  /// (compares our own call of the peer's sequence number when we remember it).
  std::string mismatch(const CollDesc& mine, int peer, const CollDesc& theirs) const;
  /// Throws a mismatch if `peer` called something else than we did as the
  /// collective before `desc` (a mismatch that the data flow did not reveal,
  /// e.g. two roots whose chains both reached this rank), as far as we can see
  /// it: the peer's board (shared memory) or its frames' note of it (TCP).
  void checkPrevious(const CollDesc& desc, int peer) const;
  /// Throws a mismatch if a peer's next collective-lane slot belongs to collective #upto or earlier.
  void checkInbox(const CollDesc& desc, uint64_t upto) const;
  bool progressSend(Step& s, std::vector<Step>& steps, const CollDesc& desc);
  bool progressRecv(Step& s, std::vector<Step>& steps, const CollDesc& desc, DType dtype, RedOp op);
  void checkFailures(const WaitScope& scope);
  std::string timeoutMessage(const WaitScope& scope, const std::string& where) const;
  void sleepOnDoorbell(uint32_t token, Clock::time_point deadline);

  transport::Transport& tr_;
  WaitConfig wc_;
  uint64_t mailbox_round_ = 0;  // same on every rank: each round is entered by all
  std::vector<char> exchanged_;  // the pieces of an exchange round (no mailboxes), rank r's at r * len
  std::vector<Step> exchange_steps_;
  static constexpr size_t kHistory = 64;
  CollDesc history_[kHistory];  // our recent calls, by sequence number
  std::atomic<bool> stop_{false};
};

template <typename Pass>
void Executor::drive(Pass&& pass, const CollDesc* desc, const char* what, Clock::time_point deadline,
                     int64_t timeout_ms) {
  kernels::Backoff backoff(wc_.spin_ns, wc_.yields);
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
    if (tr_.abortedBy() || stop_.load(std::memory_order_relaxed)) checkFailures(scope);
    if (!backoff.idle()) continue;
    // NOTE: announce before the last pass; a peer that publishes after it sees
    // the announcement and moves the doorbell, so the sleep returns at once.
    uint32_t token = tr_.announce();
    waiting.clear();
    moved = pass(waiting);
    if (!moved && !waiting.empty()) {
      try {
        checkFailures(scope);
      } catch (...) {
        tr_.unannounce();
        throw;
      }
      sleepOnDoorbell(token, deadline);
    }
    tr_.unannounce();
    if (waiting.empty()) return;
    backoff.reset();
  }
}

/// "rank 1 called X as collective #57, rank 0 called Y" (the desync message).
std::string desyncMessage(int me, const CollDesc& mine, int peer, const CollDesc& theirs);

}  // namespace tilecomm::exec

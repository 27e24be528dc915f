// Point-to-point engine: send, recv and recv-from-any-source on their own lane
// and their own thread. Many operations progress at once (an isend never
// waits for the caller, and a batch of sends and receives cannot deadlock);
// operations between one pair of ranks in one direction stay in order.
// Messages are matched by (source, tag); a message that arrives before its
// receive is posted, or ahead of one with another tag, is kept aside.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "exec/executor.h"

namespace tilecomm::exec {

/// Tags from here on belong to the backend itself (user tags are ints): its messages never match a
/// user's receive.
constexpr int64_t kInternalTags = int64_t{1} << 32;

struct P2POp {
  bool send = false;
  int peer = -1;  // -1: any source
  int64_t tag = 0;  // the user's (an int), or one of the backend's own above them (kInternalTags)
  char* ptr = nullptr;
  size_t nbytes = 0;
  int64_t timeout_ms = 0;
  std::string label;  // names the operation in a timeout's message ("": its kind, peer, tag and size)
  /// Called once on the engine thread: (source rank, "" or an error message).
  std::function<void(int, const std::string&)> done;
  // progress, owned by the engine
  size_t progress = 0;
  bool matched = false;  // receive: its message has been found
  bool finished = false;
  Clock::time_point deadline;
};

class P2PEngine {
 public:
  P2PEngine(Executor& exec, std::function<void(const std::string&)> on_fatal);
  ~P2PEngine();
  void start();
  /// Fails the pending operations ("process group destroyed ...") and joins the thread; later posts
  /// fail at once. Idempotent; the destructor calls it.
  void stop();
  void post(P2POp op);
  /// Waits (at most `limit`) until every send under an internal tag that was posted has ended.
  void flushInternalSends(std::chrono::milliseconds limit);

 private:
  struct Unexpected {  // a message set aside, possibly still arriving
    int64_t tag;
    std::vector<char> data;
    size_t arrived = 0;
  };
  enum class Sink { kNone, kOp, kUnexpected, kDiscard };
  struct Inbound {  // per source: who takes the slices of the message in flight
    Sink sink = Sink::kNone;
    P2POp* op = nullptr;
    size_t msg_bytes = 0, got = 0;
    std::deque<Unexpected> aside;
  };

  void loop();
  bool pass(std::vector<int>& waiting);
  bool progressSend(P2POp& op);
  /// claimed[src]: the tags of receives posted earlier that src's messages could match and that are
  /// still unmatched in this pass (Note [Receive order]).
  bool progressRecv(P2POp& op, const std::vector<std::vector<int64_t>>& claimed);
  bool drainInbound(int src);
  bool takeAside(P2POp& op, int src);
  void finish(std::list<P2POp>::iterator it, const std::string& err);
  bool stopping(const std::string& msg) const;
  static constexpr const char* kStopped = "process group destroyed with point-to-point operations pending";

  Executor& exec_;
  std::function<void(const std::string&)> on_fatal_;
  std::vector<Inbound> in_;
  std::vector<uint64_t> sent_msgs_;
  std::list<P2POp> pending_;  // in posting order

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<P2POp> incoming_;
  bool stop_ = false;
  std::string failed_;
  std::atomic<int64_t> internal_sends_{0};  // posted and not yet finished
  std::thread thread_;
};

}  // namespace tilecomm::exec

// One process group's engine: its transport, its algorithms and decision
// table, and the progress threads that run its operations in issue order.
//
// Note [Issue order]: every collective gets a ticket when it is issued and
// runs when all earlier tickets are done. Asynchronous collectives run on the
// group's worker thread; a synchronous one (the caller waits right away) runs
// on the caller's thread once its turn comes, which saves two thread hand-offs
// on the latency-critical path. Point-to-point operations run on a second
// thread over their own lane, so an isend never holds up a collective.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/direct.h"
#include "common/types.h"
#include "exec/executor.h"
#include "exec/p2p.h"
#include "exec/schedule.h"
#include "transport/transport.h"

namespace tilecomm::exec {

struct EngineConfig {
  transport::ShmConfig shm;
  transport::TcpConfig tcp;
  WaitConfig wait;
  int64_t timeout_ms = 30 * 60 * 1000;
};

/// One collective call, resolved to a buffer the schedule runs over.
struct CollCall {
  Coll coll;
  uint16_t algo;
  char* buf;          // the schedule's buffer
  uint64_t count;     // elements in buf
  DType dtype;
  RedOp op;           // kNone for data movement
  int root;           // -1 when not rooted
  uint64_t desc_count;  // what must agree across ranks (see CollDesc::count)
  int64_t timeout_ms;
};

class Engine {
 public:
  Engine(int rank, int world, const EngineConfig& cfg);
  ~Engine();

  int rank() const { return rank_; }
  int world() const { return world_; }
  transport::Transport& transport() { return *tr_; }

  // ---- set-up, once per group (see transport::Transport) ----
  void unlinkOwn() { tr_->shm().unlinkOwn(); }
  void addAlgorithm(Algorithm algo);
  /// Decision table of a collective: pick the first entry with nbytes <= max_bytes.
  void setTable(Coll coll, std::vector<std::pair<uint64_t, uint16_t>> table);
  /// TILECOMM_DEBUG=INFO: a line per size class (up to max_bytes), printed to
  /// stderr the first time a call of that class picks its algorithm.
  void setNotes(Coll coll, std::vector<std::pair<uint64_t, std::string>> notes);
  void start();  // starts the progress threads

  // ---- per call ----
  /// The decision table's algorithm for an nbytes buffer; `note`: print its size class's
  /// TILECOMM_DEBUG=INFO line (not for calls that the GPU's executor runs with its own table).
  uint16_t pick(Coll coll, uint64_t nbytes, bool note = true) const;
  /// Every registered algorithm, by id (set-up is over: read-only from here on).
  const std::map<uint16_t, Algorithm>& algorithms() const { return algos_; }
  /// Runs a collective's schedule; call from inside a task (see submit/runNow).
  void run(const CollCall& call);
  /// All-to-all over explicit byte ranges (uneven splits) with algorithm `algo`;
  /// dtype and desc_count are what must agree across ranks (desc_count 0 when
  /// block sizes vary). From inside a task.
  void allToAll(uint16_t algo, const char* in, const std::vector<size_t>& in_off, const std::vector<size_t>& in_len,
                char* out, const std::vector<size_t>& out_off, const std::vector<size_t>& out_len, DType dtype,
                uint64_t desc_count, int64_t timeout_ms);

  // ---- ordering (Note [Issue order]) ----
  /// `run` does the operation; `done` reports it (completes the Work and its
  /// Future, whose callbacks may issue more operations). `done` runs after the
  /// next task has been let go, so a callback never waits behind its own task.
  struct Task {
    std::function<void()> run;
    std::function<void()> done;
  };
  void submit(Task task);  // runs on the worker thread in issue order
  void runNow(Task task);  // runs on this thread once every earlier task is done
  P2PEngine& p2p() { return *p2p_; }
  bool onWorkerThread() const { return std::this_thread::get_id() == worker_.get_id(); }

  /// Non-empty once the group has failed; every later operation fails fast with it.
  std::string failure() const;
  /// "rank r failed: why" once a peer told us the group failed, else "".
  std::string peerFailure() const;
  /// Records a failure (first one wins) and, unless it came from a peer, tells every peer.
  void fail(const std::string& msg, bool tell_peers);

 private:
  void workerLoop();
  /// runNow from inside a callback on the worker thread: runs the queued tasks
  /// ahead of this one itself (nobody else would), then this one, and reports
  /// them all after it.
  void runNowOnWorker(Task task);
  /// Marks the running task done and wakes whoever runs next. Unlocks lk.
  void advance(std::unique_lock<std::mutex>& lk);
  Clock::time_point deadline(int64_t timeout_ms) const;

  int rank_;
  int world_;
  EngineConfig cfg_;
  std::unique_ptr<transport::Transport> tr_;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<P2PEngine> p2p_;
  std::map<uint16_t, Algorithm> algos_;
  std::vector<std::vector<std::pair<uint64_t, uint16_t>>> tables_;
  std::vector<std::vector<std::pair<uint64_t, std::string>>> notes_;  // per collective; empty unless INFO
  mutable std::mutex notes_mu_;
  mutable std::vector<std::vector<bool>> noted_;
  uint64_t coll_seq_ = 0;
  std::map<uint16_t, algo::DirectFn> direct_;
  std::map<uint16_t, algo::AllToAllFn> alltoall_;
  std::vector<char> scratch_;  // direct algorithms' receive slots
  std::vector<Step> steps_;  // reused across rounds

  mutable std::mutex mu_;
  // NOTE: two condition variables, so that a synchronous call never wakes the
  // idle worker thread (a wasted context switch per call when ranks share cores).
  std::condition_variable worker_cv_;  // the worker: its next task became runnable, or stop
  std::condition_variable turn_cv_;    // synchronous callers waiting for their ticket
  int turn_waiters_ = 0;
  std::deque<std::pair<uint64_t, Task>> queue_;
  uint64_t next_ticket_ = 0;
  uint64_t serving_ = 0;
  bool stop_ = false;
  std::string failure_;
  std::thread worker_;
};

}  // namespace tilecomm::exec

#include "exec/engine.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"

namespace tilecomm::exec {

Engine::Engine(int rank, int world, const EngineConfig& cfg)
    : rank_(rank),
      world_(world),
      cfg_(cfg),
      tables_(static_cast<size_t>(Coll::kCount)),
      notes_(static_cast<size_t>(Coll::kCount)),
      noted_(static_cast<size_t>(Coll::kCount)) {
  tr_ = std::make_unique<transport::Transport>(rank, world, cfg.shm, cfg.tcp);
  exec_ = std::make_unique<Executor>(*tr_, cfg.wait);
  p2p_ = std::make_unique<P2PEngine>(*exec_, [this](const std::string& m) { fail(m, true); });
}

Engine::~Engine() {
  // NOTE: peers are not told; they may still be finishing a collective whose
  // messages from us already sit in their inboxes.
  exec_->requestStop();
  tr_->wakeSelf();
  {
    std::unique_lock<std::mutex> lk(mu_);
    stop_ = true;
  }
  worker_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  p2p_.reset();  // joins its thread before the transport goes away
}

void Engine::addAlgorithm(Algorithm algo) {
  if (algo.direct && !algo::findDirect(algo.name) && !algo::findAllToAll(algo.name))
    throw Error(ErrorKind::kInvalid, "direct algorithm " + algo.name + " has no implementation in this build");
  size_t want = algo.direct ? 0 : algo.rooted ? static_cast<size_t>(world_) : 1;
  if (algo.schedules.size() != want)
    throw Error(ErrorKind::kInvalid, "algorithm " + algo.name + ": expected " + std::to_string(want) + " schedules");
  uint16_t id = algo.id;
  if (algo::AllToAllFn fn = algo::findAllToAll(algo.name)) alltoall_[id] = fn;
  if (algo::DirectFn fn = algo::findDirect(algo.name)) direct_[id] = fn;
  algos_[id] = std::move(algo);
}

void Engine::setTable(Coll coll, std::vector<std::pair<uint64_t, uint16_t>> table) {
  if (table.empty()) throw Error(ErrorKind::kInvalid, std::string("empty decision table for ") + collName(coll));
  for (auto& e : table)
    if (!algos_.count(e.second) || algos_[e.second].coll != coll)
      throw Error(ErrorKind::kInvalid, std::string("decision table for ") + collName(coll) +
                                           " names an unknown algorithm id " + std::to_string(e.second));
  tables_[static_cast<size_t>(coll)] = std::move(table);
}

void Engine::start() {
  worker_ = std::thread([this] { workerLoop(); });
  p2p_->start();
}

void Engine::setNotes(Coll coll, std::vector<std::pair<uint64_t, std::string>> notes) {
  std::lock_guard<std::mutex> lk(notes_mu_);
  noted_[static_cast<size_t>(coll)].assign(notes.size(), false);
  notes_[static_cast<size_t>(coll)] = std::move(notes);
}

uint16_t Engine::pick(Coll coll, uint64_t nbytes, bool note) const {
  const auto& t = tables_[static_cast<size_t>(coll)];
  if (t.empty()) throw Error(ErrorKind::kInvalid, std::string("no algorithm registered for ") + collName(coll));
  const auto& notes = notes_[static_cast<size_t>(coll)];
  if (note && !notes.empty()) {
    std::lock_guard<std::mutex> lk(notes_mu_);
    for (size_t i = 0; i < notes.size(); ++i) {
      if (nbytes > notes[i].first) continue;
      if (!noted_[static_cast<size_t>(coll)][i]) {
        noted_[static_cast<size_t>(coll)][i] = true;
        std::fprintf(stderr, "tilecomm: %s\n", notes[i].second.c_str());
      }
      break;
    }
  }
  for (const auto& e : t)
    if (nbytes <= e.first) return e.second;
  return t.back().second;
}

Clock::time_point Engine::deadline(int64_t timeout_ms) const {
  return Clock::now() + std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : cfg_.timeout_ms);
}

void Engine::run(const CollCall& c) {
  const Algorithm& algo = algos_.at(c.algo);
  exec_->checkAborted();
  CollDesc desc;
  desc.seq = ++coll_seq_;
  desc.count = c.desc_count;
  desc.root = c.root;
  desc.algo = c.algo;
  desc.coll = c.coll;
  desc.dtype = c.dtype;
  desc.op = c.op;
  exec_->begin(desc);
  int64_t timeout = c.timeout_ms > 0 ? c.timeout_ms : cfg_.timeout_ms;
  Clock::time_point dl = deadline(timeout);
  auto direct = direct_.find(c.algo);
  if (direct != direct_.end()) {
    direct->second(algo::DirectArgs{*exec_, rank_, world_, c.buf, c.count, c.dtype, c.op, desc, dl, timeout, scratch_});
    return;
  }
  int shift = algo.rooted ? c.root : 0;
  const Schedule& s = algo.rooted ? algo.schedules[(rank_ - shift + world_) % world_] : algo.schedules[0];
  size_t elem = dtypeSize(c.dtype);
  uint32_t begin = 0;
  for (uint32_t end : s.round_end) {
    steps_.clear();
    for (uint32_t i = begin; i < end; ++i) {
      const SchedOp& o = s.ops[i];
      size_t lo = chunkOffset(o.lo, s.nchunks, c.count, elem);
      size_t hi = chunkOffset(o.hi, s.nchunks, c.count, elem);
      steps_.push_back(Step{o.kind, (o.peer + shift) % world_, c.buf + lo, hi - lo, o.dep});
    }
    begin = end;
    exec_->runRound(steps_, desc, c.dtype, c.op, dl, timeout);
  }
}

void Engine::allToAll(uint16_t algo, const char* in, const std::vector<size_t>& in_off,
                      const std::vector<size_t>& in_len, char* out, const std::vector<size_t>& out_off,
                      const std::vector<size_t>& out_len, DType dtype, uint64_t desc_count, int64_t timeout_ms) {
  algo::AllToAllFn fn = alltoall_.at(algo);
  exec_->checkAborted();
  CollDesc desc;
  desc.seq = ++coll_seq_;
  desc.count = desc_count;
  desc.coll = Coll::kAllToAll;
  desc.dtype = dtype;
  desc.algo = algo;
  exec_->begin(desc);
  int64_t timeout = timeout_ms > 0 ? timeout_ms : cfg_.timeout_ms;
  fn(algo::AllToAllArgs{*exec_, rank_, world_, in, in_off, in_len, out, out_off, out_len, desc, deadline(timeout),
                        timeout});
}

void Engine::submit(Task task) {
  std::unique_lock<std::mutex> lk(mu_);
  queue_.emplace_back(next_ticket_++, std::move(task));
  lk.unlock();
  worker_cv_.notify_one();
}

void Engine::runNow(Task task) {
  if (std::this_thread::get_id() == worker_.get_id()) return runNowOnWorker(std::move(task));
  std::unique_lock<std::mutex> lk(mu_);
  uint64_t ticket = next_ticket_++;
  if (serving_ != ticket) {
    ++turn_waiters_;
    turn_cv_.wait(lk, [&] { return serving_ == ticket; });
    --turn_waiters_;
  }
  lk.unlock();
  task.run();  // tasks report their own errors through their Work
  lk.lock();
  advance(lk);
  task.done();
}

void Engine::runNowOnWorker(Task task) {
  // NOTE: the drained tasks report only after this one has run. Their `done`
  // runs callbacks, and a callback's own runNow would wait for this task's
  // turn, which no thread but this one can give (a deadlock).
  std::vector<std::function<void()>> reports;
  std::unique_lock<std::mutex> lk(mu_);
  uint64_t ticket = next_ticket_++;
  while (serving_ != ticket) {
    if (!queue_.empty() && queue_.front().first == serving_) {
      Task ahead = std::move(queue_.front().second);
      queue_.pop_front();
      lk.unlock();
      ahead.run();
      lk.lock();
      advance(lk);
      reports.push_back(std::move(ahead.done));
      lk.lock();
    } else {  // another thread's synchronous call holds the turn
      ++turn_waiters_;
      turn_cv_.wait(lk);
      --turn_waiters_;
    }
  }
  lk.unlock();
  task.run();
  lk.lock();
  advance(lk);
  for (auto& done : reports) done();
  task.done();
}

void Engine::advance(std::unique_lock<std::mutex>& lk) {
  ++serving_;
  bool worker_next = !queue_.empty() && queue_.front().first == serving_;
  bool callers = turn_waiters_ > 0;
  lk.unlock();
  if (worker_next) worker_cv_.notify_one();
  if (callers) turn_cv_.notify_all();
}

void Engine::workerLoop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    worker_cv_.wait(lk, [&] {
      return (!queue_.empty() && queue_.front().first == serving_) || (stop_ && queue_.empty());
    });
    if (queue_.empty()) return;
    Task task = std::move(queue_.front().second);
    queue_.pop_front();
    lk.unlock();
    task.run();
    lk.lock();
    advance(lk);
    task.done();  // NOTE: Future callbacks run here and may call runNow (see runNowOnWorker)
    lk.lock();
  }
}

std::string Engine::failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

std::string Engine::peerFailure() const {
  const int a = tr_->abortedBy();
  return a ? "rank " + std::to_string(a - 1) + " failed: " + tr_->peerError(a - 1) : std::string();
}

void Engine::fail(const std::string& msg, bool tell_peers) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!failure_.empty()) return;
    failure_ = msg;
  }
  if (tell_peers) tr_->broadcastAbort(msg);
  tr_->wakeSelf();
}

}  // namespace tilecomm::exec

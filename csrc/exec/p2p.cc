#include "exec/p2p.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace tilecomm::exec {

using transport::kP2PLane;
using transport::ShmTransport;
using transport::Slot;

P2PEngine::P2PEngine(Executor& exec, std::function<void(const std::string&)> on_fatal)
    : exec_(exec), on_fatal_(std::move(on_fatal)) {
  int world = exec_.transport().world();
  in_.resize(world);
  sent_msgs_.assign(world, 0);
}

P2PEngine::~P2PEngine() { stop(); }

void P2PEngine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    if (failed_.empty()) failed_ = kStopped;  // later posts fail at once
  }
  cv_.notify_all();
  exec_.transport().wakeSelf();
  if (thread_.joinable()) thread_.join();
}

void P2PEngine::start() {
  thread_ = std::thread([this] { loop(); });
}

void P2PEngine::post(P2POp op) {
  std::string err;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!failed_.empty()) {
      err = failed_;
    } else {
      int64_t t = op.timeout_ms > 0 ? op.timeout_ms : 30 * 60 * 1000;
      op.deadline = Clock::now() + std::chrono::milliseconds(t);
      if (op.send && op.tag >= kInternalTags) ++internal_sends_;
      incoming_.push_back(std::move(op));
    }
  }
  if (!err.empty()) {  // NOTE: outside the lock: the callback may post again
    op.done(op.peer, err);
    return;
  }
  cv_.notify_all();
  exec_.transport().wakeSelf();  // the thread may be asleep on the doorbell
}

void P2PEngine::flushInternalSends(std::chrono::milliseconds limit) {
  const Clock::time_point deadline = Clock::now() + limit;
  while (internal_sends_.load() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

void P2PEngine::finish(std::list<P2POp>::iterator it, const std::string& err) {
  P2POp op = std::move(*it);
  pending_.erase(it);  // first: a callback that throws must not leave its operation behind
  if (op.send && op.tag >= kInternalTags) --internal_sends_;
  op.done(op.peer, err);
}

void P2PEngine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !incoming_.empty(); });
      if (stop_ && incoming_.empty()) return;
    }
    try {
      // Deadlines are per operation (checked in pass); this one only bounds the loop.
      Clock::time_point far = Clock::now() + std::chrono::hours(24 * 365);
      exec_.drive([&](std::vector<int>& waiting) { return pass(waiting); }, nullptr, "operation", far, 0);
    } catch (const std::exception& e) {
      std::string msg = e.what();
      auto* err = dynamic_cast<const Error*>(&e);
      bool from_peer = err && err->kind() == ErrorKind::kAborted;
      {
        std::lock_guard<std::mutex> lk(mu_);
        failed_ = msg;
        for (P2POp& op : incoming_) pending_.push_back(std::move(op));
        incoming_.clear();
      }
      while (!pending_.empty()) finish(pending_.begin(), msg);
      if (!stopping(msg)) on_fatal_(from_peer ? "" : msg);
    }
  }
}

bool P2PEngine::stopping(const std::string& msg) const { return msg == kStopped; }

bool P2PEngine::pass(std::vector<int>& waiting) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) throw Error(ErrorKind::kAborted, kStopped);
    for (P2POp& op : incoming_) pending_.push_back(std::move(op));
    incoming_.clear();
  }
  bool moved = false;
  std::vector<char> send_busy(in_.size(), 0);
  std::vector<std::vector<int64_t>> claimed(in_.size());  // Note [Receive order]
  Clock::time_point now = Clock::now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    P2POp& op = *it;
    auto next = std::next(it);
    if (now >= op.deadline) {
      std::string what = !op.label.empty()
                             ? op.label
                             : std::string(op.send ? "send to rank " : "recv from ") +
                                   (op.peer >= 0 ? (op.send ? "" : "rank ") + std::to_string(op.peer) : "any rank") +
                                   " (tag " + std::to_string(op.tag) + ", " + std::to_string(op.nbytes) + " bytes)";
      std::string msg = "timed out after " + std::to_string(op.timeout_ms) + " ms in point-to-point " + what +
                        " on rank " + std::to_string(exec_.transport().rank());
      // NOTE: a message cut off half way leaves its channel out of step: that fails the group.
      if (op.progress > 0 || (op.matched && !op.finished && !op.send)) throw Error(ErrorKind::kTimeout, msg);
      finish(it, msg);
      moved = true;
      it = next;
      continue;
    }
    if (op.send) {
      if (!send_busy[op.peer]) {
        moved |= progressSend(op);
        if (op.finished) {
          finish(it, "");
        } else {
          send_busy[op.peer] = 1;  // later sends to this peer wait their turn
          waiting.push_back(op.peer);
        }
      }
    } else {
      std::string err;
      try {
        moved |= progressRecv(op, claimed);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kInvalid) throw;
        err = e.what();  // this receive is wrong (size mismatch); the group is fine
      }
      if (!err.empty()) {
        moved = true;
        finish(it, err);
      } else if (op.finished) {
        finish(it, "");
      } else {
        waiting.push_back(op.peer);
        if (!op.matched)
          for (size_t src = 0; src < claimed.size(); ++src)
            if (op.peer < 0 || static_cast<size_t>(op.peer) == src) claimed[src].push_back(op.tag);
      }
    }
    it = next;
  }
  return moved;
}

bool P2PEngine::progressSend(P2POp& op) {
  transport::Transport& tr = exec_.transport();
  bool moved = false;
  while (!op.finished) {
    Slot* slot = tr.trySendSlot(kP2PLane, op.peer);
    if (!slot) break;
    size_t len = std::min<size_t>(tr.slotBytes(op.peer), op.nbytes - op.progress);
    slot->hdr.desc = CollDesc{};
    slot->hdr.msg_bytes = op.nbytes;
    slot->hdr.offset = op.progress;
    slot->hdr.len = static_cast<uint32_t>(len);
    slot->hdr.tag = op.tag;
    slot->hdr.p2p_seq = sent_msgs_[op.peer];
    std::memcpy(ShmTransport::payload(slot), op.ptr + op.progress, len);
    tr.commitSend(kP2PLane, op.peer, len);
    op.progress += len;
    moved = true;
    if (op.progress == op.nbytes) {
      op.finished = true;
      ++sent_msgs_[op.peer];
    }
  }
  return moved;
}

bool P2PEngine::takeAside(P2POp& op, int src) {
  Inbound& in = in_[src];
  for (auto it = in.aside.begin(); it != in.aside.end(); ++it) {
    if (it->tag != op.tag) continue;
    if (it->arrived < it->data.size() || (in.sink == Sink::kUnexpected && &*it == &in.aside.back()))
      return false;  // the first message with this tag is still arriving
    if (it->data.size() != op.nbytes)
      throw Error(ErrorKind::kInvalid, "rank " + std::to_string(src) + " sent " + std::to_string(it->data.size()) +
                                           " bytes with tag " + std::to_string(op.tag) + " but the receive posted " +
                                           std::to_string(op.nbytes) + " bytes");
    std::memcpy(op.ptr, it->data.data(), op.nbytes);
    in.aside.erase(it);
    op.peer = src;
    op.matched = op.finished = true;
    return true;
  }
  return false;
}

bool P2PEngine::drainInbound(int src) {
  transport::Transport& tr = exec_.transport();
  Inbound& in = in_[src];
  bool moved = false;
  while (in.sink != Sink::kNone) {
    const Slot* slot = tr.tryRecvSlot(kP2PLane, src);
    if (!slot) break;
    const transport::SlotHeader h = slot->hdr;
    if (h.msg_bytes != in.msg_bytes || h.offset != in.got || h.len > tr.slotBytes(src) ||
        h.len > in.msg_bytes - in.got || (h.len == 0 && in.msg_bytes != 0))
      throw Error(ErrorKind::kDesync, "malformed point-to-point slice from rank " + std::to_string(src));
    const char* p = ShmTransport::payload(slot);
    if (in.sink == Sink::kOp) {
      std::memcpy(in.op->ptr + in.got, p, h.len);
    } else if (in.sink == Sink::kUnexpected) {
      std::memcpy(in.aside.back().data.data() + in.got, p, h.len);
      in.aside.back().arrived += h.len;
    }
    tr.releaseRecv(kP2PLane, src, h.len);
    in.got += h.len;
    moved = true;
    if (in.got == in.msg_bytes) {
      if (in.sink == Sink::kOp) in.op->finished = true;
      in.sink = Sink::kNone;
      in.op = nullptr;
    }
  }
  return moved;
}

// Note [Receive order]: a message from src goes to the receive posted first among those it matches
// (its source, or any source, and its tag), as in MPI. One pass walks the receives in posting order,
// but messages keep arriving during the walk: a message that reached src's lane only after an
// earlier receive that matches it had looked must not be taken by a later one. So a later receive
// leaves src alone, in this pass, wherever an earlier one with its tag is still unmatched
// (`claimed`); the next pass gives the message to the earlier one.
bool P2PEngine::progressRecv(P2POp& op, const std::vector<std::vector<int64_t>>& claimed) {
  transport::Transport& tr = exec_.transport();
  int world = static_cast<int>(in_.size());
  if (op.matched) return drainInbound(op.peer);
  bool moved = false;
  for (int i = 0; i < world; ++i) {
    int src = op.peer >= 0 ? op.peer : i;
    if (src == tr.rank() || (op.peer >= 0 && i > 0)) continue;
    Inbound& in = in_[src];
    if (std::find(claimed[src].begin(), claimed[src].end(), op.tag) != claimed[src].end()) {
      if (in.sink != Sink::kNone) moved |= drainInbound(src);  // keep a message in flight moving
      continue;
    }
    if (takeAside(op, src)) return true;
    if (in.sink != Sink::kNone) {  // another message from src is in flight: keep it moving
      moved |= drainInbound(src);
      if (in.sink != Sink::kNone) continue;
      if (takeAside(op, src)) return true;
    }
    const Slot* slot = tr.tryRecvSlot(kP2PLane, src);
    if (!slot) continue;
    const transport::SlotHeader h = slot->hdr;
    if (h.offset != 0) throw Error(ErrorKind::kDesync, "point-to-point stream from rank " + std::to_string(src) +
                                                           " is out of step");
    in.msg_bytes = h.msg_bytes;
    in.got = 0;
    if (h.tag == op.tag) {
      if (h.msg_bytes != op.nbytes) {
        in.sink = Sink::kDiscard;
        drainInbound(src);
        throw Error(ErrorKind::kInvalid, "rank " + std::to_string(src) + " sent " + std::to_string(h.msg_bytes) +
                                             " bytes with tag " + std::to_string(h.tag) +
                                             " but the receive posted " + std::to_string(op.nbytes) + " bytes");
      }
      in.sink = Sink::kOp;
      in.op = &op;
      op.peer = src;
      op.matched = true;
      drainInbound(src);
      return true;
    }
    // A message for another receive: set it aside and look again.
    in.sink = Sink::kUnexpected;
    in.aside.push_back(Unexpected{h.tag, std::vector<char>(h.msg_bytes), 0});
    moved |= drainInbound(src);
  }
  return moved;
}

}  // namespace tilecomm::exec

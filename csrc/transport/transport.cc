#include "transport/transport.h"

#include "common/error.h"

namespace tilecomm::transport {

Transport::Transport(int rank, int world, const ShmConfig& shm, const TcpConfig& tcp)
    : shm_(std::make_unique<ShmTransport>(rank, world, shm)), tcp_cfg_(tcp), links_(world, Link::kShm) {
  links_[rank] = Link::kSelf;
}

Transport::~Transport() { tcp_.reset(); }

uint16_t Transport::listen(const std::string& address) {
  if (!tcp_) tcp_ = std::make_unique<TcpTransport>(rank(), world(), tcp_cfg_.frame_bytes, tcp_cfg_, *shm_);
  return tcp_->listen(address);
}

void Transport::connect(const std::vector<Link>& links, const std::vector<std::string>& names,
                        const std::vector<int64_t>& pids, const std::vector<std::string>& addrs,
                        const std::vector<int>& ports, const std::string& token, int64_t timeout_ms) {
  const int w = world();
  if (static_cast<int>(links.size()) != w || static_cast<int>(addrs.size()) != w ||
      static_cast<int>(ports.size()) != w)
    throw Error(ErrorKind::kInvalid, "connect: expected one link, address and port per rank");
  std::vector<bool> local(w), remote(w);
  for (int r = 0; r < w; ++r) {
    if (r == rank()) continue;
    links_[r] = links[r];
    local[r] = links[r] == Link::kShm;
    remote[r] = links[r] == Link::kTcp;
    all_shm_ = all_shm_ && local[r];
  }
  shm_->connect(names, pids, local);
  if (!all_shm_) {
    if (!tcp_) throw Error(ErrorKind::kInvalid, "connect: TCP peers but no listener (call listen first)");
    tcp_->connect(remote, addrs, ports, token, timeout_ms);
  }
}

void Transport::commitSend(int lane, int peer, size_t len) {
  if (tcp(peer)) {
    tcp_->commitSend(lane, peer);
  } else {
    shm_->commitSend(lane, peer);
  }
  LinkCounters& c = counters_[static_cast<int>(links_[peer])];
  c.bytes_sent.fetch_add(len, std::memory_order_relaxed);
  c.messages_sent.fetch_add(1, std::memory_order_relaxed);
}

void Transport::releaseRecv(int lane, int peer, size_t len) {
  if (tcp(peer)) {
    tcp_->releaseRecv(lane, peer);
  } else {
    shm_->releaseRecv(lane, peer);
  }
  LinkCounters& c = counters_[static_cast<int>(links_[peer])];
  c.bytes_received.fetch_add(len, std::memory_order_relaxed);
  c.messages_received.fetch_add(1, std::memory_order_relaxed);
}

void Transport::countMailbox(bool sent, size_t len) {
  LinkCounters& c = counters_[static_cast<int>(Link::kShm)];
  (sent ? c.bytes_sent : c.bytes_received).fetch_add(len, std::memory_order_relaxed);
  (sent ? c.messages_sent : c.messages_received).fetch_add(1, std::memory_order_relaxed);
}

void Transport::broadcastAbort(const std::string& msg) {
  shm_->broadcastAbort(msg);
  if (tcp_) tcp_->broadcastAbort(msg);
}

bool Transport::peerGone(int peer, int lane) const {
  return tcp(peer) ? tcp_->peerDead(peer, lane) : shm_->peerDead(peer);
}

int Transport::lastPeerIfAllGone(int lane) const {
  int found = -1;
  for (int r = 0; r < world(); ++r) {
    if (r == rank()) continue;
    if (!peerGone(r, lane)) return -1;
    found = r;
  }
  return found;
}

std::string Transport::deathNote(int peer) const {
  if (tcp(peer)) return "the connection to rank " + std::to_string(peer) + " failed (" + tcp_->failure(peer) + ")";
  return "rank " + std::to_string(peer) + " (pid " + std::to_string(shm_->peerPid(peer)) + ") exited";
}

std::optional<BoardEntry> Transport::readBoard(int peer) const {
  if (tcp(peer)) return std::nullopt;
  return shm_->readBoard(peer);
}

Transport::Stats Transport::stats(Link l) const {
  const LinkCounters& c = counters_[static_cast<int>(l)];
  return Stats{c.bytes_sent.load(), c.messages_sent.load(), c.bytes_received.load(), c.messages_received.load()};
}

}  // namespace tilecomm::transport

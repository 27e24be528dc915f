// The links of one group: every peer is reached either through shared memory
// (same host) or through TCP (another host, or every peer when forced). This
// class gives the executor one slot interface over both, and counts the
// traffic of each link class.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/shm.h"
#include "transport/tcp.h"

namespace tilecomm::transport {

enum class Link : uint8_t { kSelf = 0, kShm = 1, kTcp = 2 };
constexpr int kLinkClasses = 3;  // indexes counters_ (kSelf unused)

class Transport {
 public:
  Transport(int rank, int world, const ShmConfig& shm, const TcpConfig& tcp);
  ~Transport();

  ShmTransport& shm() { return *shm_; }
  int rank() const { return shm_->rank(); }
  int world() const { return shm_->world(); }
  /// Payload bytes of a shared-memory slot (and a mailbox).
  uint32_t slotBytes() const { return shm_->slotBytes(); }
  /// Payload bytes of one slice to or from `peer`: its link's slot (or TCP frame) size.
  uint32_t slotBytes(int peer) const { return tcp(peer) ? tcp_cfg_.frame_bytes : shm_->slotBytes(); }

  // ---- set-up ----
  /// Starts this rank's TCP listener on `address`; returns its port.
  uint16_t listen(const std::string& address);
  /// Connects every peer over links[r] (shared memory: names/pids; TCP:
  /// addrs/ports, authenticated with `token`).
  void connect(const std::vector<Link>& links, const std::vector<std::string>& names,
               const std::vector<int64_t>& pids, const std::vector<std::string>& addrs,
               const std::vector<int>& ports, const std::string& token, int64_t timeout_ms);
  Link link(int peer) const { return links_[peer]; }
  /// Whether every peer is in shared memory, so mailbox rounds can be used.
  bool mailboxes() const { return all_shm_; }

  // ---- slots (see ShmTransport; `len` is the payload, for the counters) ----
  Slot* trySendSlot(int lane, int peer) {
    return tcp(peer) ? tcp_->trySendSlot(lane, peer) : shm_->trySendSlot(lane, peer);
  }
  void commitSend(int lane, int peer, size_t len);
  const Slot* tryRecvSlot(int lane, int peer) {
    return tcp(peer) ? tcp_->tryRecvSlot(lane, peer) : shm_->tryRecvSlot(lane, peer);
  }
  void releaseRecv(int lane, int peer, size_t len);
  /// Counts a mailbox post (sent) and a peer's mailbox read (received).
  void countMailbox(bool sent, size_t len);

  // ---- waiting and the board: this rank's own segment (TCP deliveries ring it too) ----
  uint32_t announce() { return shm_->announce(); }
  void sleep(uint32_t token, int64_t timeout_us) { shm_->sleep(token, timeout_us); }
  void unannounce() { shm_->unannounce(); }
  void wakeSelf() { shm_->wakeSelf(); }
  void publishBoard(const CollDesc& d) {
    shm_->publishBoard(d);
    shm_->heartbeat();
    if (tcp_) tcp_->noteCall(d);
  }
  void heartbeat() { shm_->heartbeat(); }
  /// How long (ns) a shared-memory peer has not run a wait or a collective; nullopt over TCP.
  std::optional<int64_t> idleNs(int peer) const {
    if (tcp(peer)) return std::nullopt;
    return ShmTransport::nowNs() - shm_->lastAlive(peer);
  }

  // ---- failure ----
  int abortedBy() const { return shm_->abortedBy(); }
  std::string peerError(int peer) const { return tcp(peer) ? tcp_->peerError(peer) : shm_->peerError(peer); }
  void broadcastAbort(const std::string& msg);
  /// Whether a waiter on `lane` will hear no more from `peer` (its process
  /// exited, or its connection failed or closed after everything it sent was read).
  bool peerGone(int peer, int lane) const;
  /// The last peer when every peer is gone, else -1.
  int lastPeerIfAllGone(int lane) const;
  /// "rank 3 (pid 123) exited" or "the connection to rank 3 failed: ...".
  std::string deathNote(int peer) const;
  /// What a peer's board says, where it can be read (shared-memory peers).
  std::optional<BoardEntry> readBoard(int peer) const;
  /// The collective a peer is in as far as we know: its board (shared memory),
  /// or the last one it reported waiting in (TCP, see announceBoard).
  std::optional<BoardEntry> reportedBoard(int peer) const {
    return tcp(peer) ? tcp_->peerBoard(peer) : readBoard(peer);
  }
  /// What a peer called (or reported waiting in) as collective #seq, if still recent.
  std::optional<BoardEntry> readBoardAt(int peer, uint64_t seq) const {
    return tcp(peer) ? tcp_->peerBoardAt(peer, seq) : shm_->readBoardAt(peer, seq);
  }
  /// Tells peers over TCP, once per collective, that we are waiting in `d`.
  void announceBoard(const CollDesc& d) {
    if (!tcp_ || d.seq == announced_) return;
    announced_ = d.seq;
    tcp_->broadcastBoard(BoardEntry{d.seq, d});
  }

  struct Stats {
    uint64_t bytes_sent, messages_sent, bytes_received, messages_received;
  };
  Stats stats(Link l) const;

 private:
  bool tcp(int peer) const { return links_[peer] == Link::kTcp; }

  std::unique_ptr<ShmTransport> shm_;
  TcpConfig tcp_cfg_;
  std::unique_ptr<TcpTransport> tcp_;  // destroyed first: its thread uses shm_
  std::vector<Link> links_;
  bool all_shm_ = true;
  uint64_t announced_ = 0;  // the last collective announceBoard reported
  LinkCounters counters_[kLinkClasses];
};

}  // namespace tilecomm::transport

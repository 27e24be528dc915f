// Shared-memory transport for ranks on one host.
//
// Every rank owns one POSIX segment: a header (doorbell, abort word, the
// "board" naming the collective it is in), its two mailbox buffers, then its
// inboxes, one channel per (sending peer, lane). A channel is a ring of slots; the sender
// fills slot k, then publishes seq = k + 1; the receiver consumes it and
// advances `consumed`. Sequence values only grow, nothing is reset in place.
// Segments are created owner-only with unguessable names and unlinked as soon
// as every peer has mapped them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/types.h"

namespace tilecomm::transport {

/// Lanes keep collective traffic and point-to-point traffic apart, so an
/// isend posted before a collective never blocks it.
enum Lane : int { kCollLane = 0, kP2PLane = 1, kNumLanes = 2 };

/// What a slot says about its payload. Validated by the receiver before any copy.
struct SlotHeader {
  CollDesc desc;       // collective lane: the sender's descriptor
  uint64_t msg_bytes;  // total bytes of the message this slot belongs to
  uint64_t offset;     // byte offset of this slot's payload in the message
  uint32_t len;        // payload bytes in this slot
  int64_t tag;         // point-to-point lane: the message's tag (exec/p2p.h)
  uint64_t p2p_seq;    // point-to-point lane: message number on this channel
};

struct Slot {
  std::atomic<uint64_t> seq;  // message index + 1 once published
  SlotHeader hdr;
  // payload follows at kSlotHeaderBytes
};
constexpr size_t kSlotHeaderBytes = 128;
constexpr size_t kBoardRows = 16;  // recent calls each rank keeps on its board
static_assert(sizeof(Slot) <= kSlotHeaderBytes, "slot header outgrew its space");

struct ShmConfig {
  uint32_t slots = 4;             // slots per channel
  uint32_t slot_bytes = 1 << 16;  // payload bytes per slot (multiple of 64)
};

// Note [Mailbox]
// For small messages a point-to-point exchange costs every rank one wake-up
// per peer. A mailbox round costs one: every rank copies its contribution into
// its own mailbox buffer and increments one arrival counter (in rank 0's
// segment); the rank whose increment completes the round wakes the others,
// who then read what they need straight from the peers' buffers. Rounds use the
// two buffers alternately. Rank r fills its buffer of round k + 2 only after
// round k + 1 completed, i.e. after every rank arrived at k + 1 and so had
// finished reading round k: users read a round's buffers before their next
// arrival. The counter only grows.

/// The board: which collective a rank is in, read by peers for diagnostics.
struct BoardEntry {
  uint64_t seq;
  CollDesc desc;
};

class ShmTransport {
 public:
  ShmTransport(int rank, int world, const ShmConfig& cfg);
  ~ShmTransport();
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  const std::string& segmentName() const { return name_; }
  /// Maps the segment of every peer with local[r] set (names[r], pids[r]);
  /// opens liveness handles. Other peers are reached another way.
  void connect(const std::vector<std::string>& names, const std::vector<int64_t>& pids, const std::vector<bool>& local);
  /// Removes this rank's segment name; call once every peer has mapped it.
  void unlinkOwn();

  int rank() const { return rank_; }
  int world() const { return world_; }
  uint32_t slotBytes() const { return cfg_.slot_bytes; }

  // ---- sending: the slot to fill, or nullptr while the channel is full ----
  Slot* trySendSlot(int lane, int peer);
  static char* payload(Slot* s) { return reinterpret_cast<char*>(s) + kSlotHeaderBytes; }
  static const char* payload(const Slot* s) { return reinterpret_cast<const char*>(s) + kSlotHeaderBytes; }
  /// Publishes the slot returned by trySendSlot and wakes the peer.
  void commitSend(int lane, int peer);

  // ---- receiving: the next published slot from peer, or nullptr ----
  const Slot* tryRecvSlot(int lane, int peer);
  /// Frees the slot returned by tryRecvSlot and wakes its sender.
  void releaseRecv(int lane, int peer);

  // ---- mailbox rounds (Note [Mailbox]) ----
  /// Our (owner == rank()) or a peer's mailbox buffer of `round` (1, 2, ..).
  Slot* mailbox(int owner, uint64_t round) const;
  /// Publishes our buffer of `round` and counts our arrival; the last rank to
  /// arrive wakes the others.
  void arrive(uint64_t round);
  /// Whether every rank has arrived at `round`.
  bool allArrived(uint64_t round) const;

  // ---- waiting ----
  /// Sleep protocol: announce(), re-check for work, then sleep(token, us), then unannounce().
  uint32_t announce();
  void sleep(uint32_t token, int64_t timeout_us);
  void unannounce();
  /// Wakes this rank's own sleepers (used on shutdown and local errors).
  void wakeSelf();
  /// Moves this rank's doorbell, waking its sleepers if any (another
  /// transport's thread uses it when it delivered something).
  void ringSelf() { ring(rank_); }

  // ---- failure ----
  /// First failed rank that told us (0 when none), and its message.
  int abortedBy() const;
  std::string peerError(int peer) const;
  /// Records msg in our segment and tells every mapped peer that we failed.
  void broadcastAbort(const std::string& msg);
  /// Records that `peer` told us (another way) that it failed.
  void noteAbort(int peer);
  /// Whether the process of mapped peer `peer` has exited.
  bool peerDead(int peer) const;
  int64_t peerPid(int peer) const { return pids_[peer]; }

  // ---- board ----
  void publishBoard(const CollDesc& d);
  /// The latest call on `peer`'s board ({0, {}} before its first).
  BoardEntry readBoard(int peer) const;
  /// What `peer` called as collective #seq, if that is among its recent calls.
  std::optional<BoardEntry> readBoardAt(int peer, uint64_t seq) const;
  /// Liveness: this rank records the time whenever it starts a collective or
  /// waits (at least every sleep); a peer's stale time means it is not running.
  void heartbeat();
  int64_t lastAlive(int peer) const;  // steady-clock ns (one clock per host)
  static int64_t nowNs();

 private:
  struct SegHeader;
  SegHeader* header(int r) const;
  Slot* slot(int owner, int src, int lane, uint64_t k) const;
  std::atomic<uint64_t>* consumed(int owner, int src, int lane) const;
  void ring(int peer);
  char* channelBase(int owner) const;

  int rank_;
  int world_;
  ShmConfig cfg_;
  size_t slot_stride_;
  size_t channel_stride_;
  size_t seg_bytes_;
  std::string name_;
  bool unlinked_ = false;
  std::vector<char*> bases_;           // mapped segment of every rank (ours included)
  std::vector<int> pidfds_;            // liveness handles (-1 when unavailable)
  std::vector<int64_t> pids_;
  std::vector<uint64_t> sent_;         // [lane][peer] messages published to peer
  std::vector<uint64_t> recvd_;        // [lane][peer] messages consumed from peer
};

}  // namespace tilecomm::transport

// TCP transport for ranks on different hosts (or every rank, when forced).
//
// Each pair of ranks has one connection per lane, so point-to-point traffic
// never queues behind a collective or the other way round. Both ends keep the
// shared-memory slot model: a channel is a ring of `slots` slots in local memory
// on each side. The sender fills slot k and commits it; the frame (header +
// payload) goes onto the socket at once if the socket takes it, else the I/O
// thread finishes it. The I/O thread reads frames straight into the receive
// ring, validates every header before a byte of payload is copied, publishes
// seq = k + 1, and rings the rank's own doorbell (Note [Mailbox] waiting is the
// same as for shared memory). A full receive ring stops reading that socket,
// which is the flow control: TCP's window then holds the sender back.
//
// Note [TCP frames]: a frame is a FrameHeader followed by `len` payload bytes.
// The receiver checks magic, kind, lane, length bounds and that `seq` is the
// next frame number of the connection; any mismatch fails the connection with
// an error naming the peer, and nothing of that frame is copied anywhere.
// Connections are set up once per group: the higher rank connects, both sides
// exchange a Hello carrying the job's token (from the c10d Store), their ranks,
// the lane and the world size; the listener accepts only Hellos that match and
// closes its listening socket once every expected connection arrived. Frames
// are sent in the host's byte order (all hosts of a job are x86-64 or all
// aarch64, both little-endian).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transport/shm.h"

namespace tilecomm::transport {

constexpr uint32_t kFrameMagic = 0x74636632;  // "tcf2" (the slot header's tag widened to 64 bits)
constexpr size_t kTokenBytes = 32;
constexpr size_t kAbortBytes = 1024;

// kBoard: "I am waiting in this collective" (a BoardEntry), sent once per collective
// when a rank starts to sleep in it, so that peers over TCP can tell a mismatch
// from a slow peer, as shared-memory peers do by reading each other's board.
enum class FrameKind : uint8_t { kData = 1, kAbort = 2, kBoard = 3 };

struct FrameHeader {
  uint32_t magic;
  FrameKind kind;
  uint8_t lane;
  uint16_t reserved;
  uint32_t len;  // payload bytes that follow
  uint32_t reserved2;
  uint64_t seq;  // data frames: frame number on this connection, from 0; abort frames: the next one
  SlotHeader hdr;  // data frames: what the sender's slot said
  // Data frames: the sender's call before hdr.desc's (seq 0 if unknown), so a receiver
  // that is a collective behind can say what the sender called in its place.
  CollDesc before;
};

/// Why `h` must be rejected on a connection of `lane` that expects frame
/// `expected_seq` with slots of `slot_bytes` (empty: it is acceptable).
std::string checkFrame(const FrameHeader& h, int lane, uint64_t expected_seq, uint32_t slot_bytes);

/// The first IPv4 (else IPv6) address of network interface `ifname`; throws
/// tilecomm::Error naming the interfaces there are when it has none.
std::string interfaceAddress(const std::string& ifname);

struct Hello {
  uint32_t magic;
  uint32_t world;
  int32_t from;
  int32_t to;
  int32_t lane;
  uint32_t slot_bytes;
  char token[kTokenBytes];
};

struct TcpConfig {
  uint32_t slots = 8;               // slots per channel and direction
  uint32_t frame_bytes = 1 << 18;   // payload bytes per slot (and frame)
};

/// Counters of one link class (all atomics: read from Python while traffic runs).
struct LinkCounters {
  std::atomic<uint64_t> bytes_sent{0}, messages_sent{0}, bytes_received{0}, messages_received{0};
};

class TcpTransport {
 public:
  /// `shm` is this rank's own segment: its doorbell wakes waiters, its abort
  /// word records a peer's abort frame.
  TcpTransport(int rank, int world, uint32_t slot_bytes, const TcpConfig& cfg, ShmTransport& shm);
  ~TcpTransport();
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  /// Listens on `address` (an IPv4 or IPv6 literal), port 0. Returns the port.
  uint16_t listen(const std::string& address);
  /// Connects to every peer with remote[r] set (addrs[r] = "host", ports[r]),
  /// authenticating with `token`; returns once every connection is up. Throws
  /// tilecomm::Error on failure or when `timeout_ms` passes.
  void connect(const std::vector<bool>& remote, const std::vector<std::string>& addrs,
               const std::vector<int>& ports, const std::string& token, int64_t timeout_ms);

  Slot* trySendSlot(int lane, int peer);
  void commitSend(int lane, int peer);
  const Slot* tryRecvSlot(int lane, int peer);
  void releaseRecv(int lane, int peer);

  /// Sends an abort frame with `msg` to every connected peer (best effort).
  void broadcastAbort(const std::string& msg);
  /// Sends our board entry to every connected peer (a kBoard frame).
  void broadcastBoard(const BoardEntry& e);
  /// Records that this rank started collective `d` (data frames carry the call before theirs).
  void noteCall(const CollDesc& d);
  /// The latest board entry `peer` sent, or the one of collective #seq (if recent).
  std::optional<BoardEntry> peerBoard(int peer) const;
  std::optional<BoardEntry> peerBoardAt(int peer, uint64_t seq) const;
  /// The abort message `peer` sent us, or "".
  std::string peerError(int peer) const;
  /// Whether `peer` is gone for a waiter on `lane`: its connection failed, or
  /// closed cleanly and every frame it sent before has been consumed.
  bool peerDead(int peer, int lane) const;
  /// Why the connection to `peer` failed.
  std::string failure(int peer) const;

  /// For fuzzers: `bytes` arrive on a connection from rank 1 and every frame
  /// the receiver accepts is consumed as the executor would. Returns why the
  /// connection was failed ("" when the stream was well-formed).
  static std::string fuzzReceive(const std::string& bytes, uint32_t slot_bytes);

 private:
  struct Conn;
  Conn& conn(int lane, int peer) { return *conns_[peer * kNumLanes + lane]; }
  void addConn(int fd, int peer, int lane);
  const Conn& conn(int lane, int peer) const { return *conns_[peer * kNumLanes + lane]; }
  bool flush(Conn& c);  // with c.tx_mu held; false once the socket is full
  bool readFrames(Conn& c);
  void fail(Conn& c, const std::string& why, bool closed = false);
  void ioLoop();
  void wakeIo();
  Slot* ringSlot(std::vector<char>& ring, uint64_t k) const;

  int rank_;
  int world_;
  uint32_t slot_bytes_;
  TcpConfig cfg_;
  ShmTransport& shm_;
  size_t stride_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int event_fd_ = -1;
  std::vector<std::unique_ptr<Conn>> conns_;  // [peer][lane], null for local peers
  std::atomic<bool> stop_{false};
  std::thread io_;
  mutable std::mutex calls_mu_;
  CollDesc calls_[kBoardRows] = {};  // this rank's recent calls, by seq % kBoardRows
};

}  // namespace tilecomm::transport

#include "transport/tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <linux/sockios.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"

namespace tilecomm::transport {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kHelloMagic = 0x74636830;  // "tch0"

std::string peerName(int peer) { return "rank " + std::to_string(peer); }

int64_t msLeft(Clock::time_point deadline) {
  return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
}

// A socket address for an IPv4 or IPv6 literal.
socklen_t toSockaddr(const std::string& host, int port, sockaddr_storage& ss) {
  std::memset(&ss, 0, sizeof(ss));
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    return sizeof(sockaddr_in);
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    return sizeof(sockaddr_in6);
  }
  throw Error(ErrorKind::kInvalid, "'" + host + "' is not an IPv4 or IPv6 address");
}

void setNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Moves exactly n bytes over a non-blocking socket before the deadline; "" or why not.
std::string ioExact(int fd, char* p, size_t n, bool out, Clock::time_point deadline) {
  while (n > 0) {
    ssize_t r = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return "the connection was closed";
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return std::strerror(errno);
    struct pollfd pf = {fd, static_cast<short>(out ? POLLOUT : POLLIN), 0};
    int64_t left = msLeft(deadline);
    if (left == 0) return "timed out";
    poll(&pf, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return "";
}

}  // namespace

std::string interfaceAddress(const std::string& ifname) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throwSystemError("getifaddrs");
  std::string v4, v6, names;
  for (struct ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    if (names.find(std::string(a->ifa_name) + " ") == std::string::npos) names += std::string(a->ifa_name) + " ";
    if (ifname != a->ifa_name) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (a->ifa_addr->sa_family == AF_INET && v4.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof(buf));
      v4 = buf;
    } else if (a->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, buf, sizeof(buf));
      v6 = buf;
    }
  }
  freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  throw Error(ErrorKind::kInvalid, "TILECOMM_SOCKET_IFNAME=" + ifname + ": no such interface with an address (there are: " +
                                       names + ")");
}

std::string checkFrame(const FrameHeader& h, int lane, uint64_t expected_seq, uint32_t slot_bytes) {
  if (h.magic != kFrameMagic) return "bad magic " + std::to_string(h.magic);
  if (h.lane != lane) return "frame for lane " + std::to_string(h.lane) + " on lane " + std::to_string(lane);
  if (h.seq != expected_seq)
    return "frame #" + std::to_string(h.seq) + " where #" + std::to_string(expected_seq) + " was due";
  if (h.kind != FrameKind::kData && lane != kCollLane)
    return "control frame (kind " + std::to_string(static_cast<int>(h.kind)) + ") on the point-to-point lane";
  if (h.kind == FrameKind::kAbort) {
    if (h.len > kAbortBytes) return "abort frame of " + std::to_string(h.len) + " bytes";
    return "";
  }
  if (h.kind == FrameKind::kBoard) {
    if (h.len != sizeof(BoardEntry)) return "board frame of " + std::to_string(h.len) + " bytes";
    return "";
  }
  if (h.kind != FrameKind::kData) return "unknown frame kind " + std::to_string(static_cast<int>(h.kind));
  if (h.len > slot_bytes)
    return "payload of " + std::to_string(h.len) + " bytes exceeds the slot size " + std::to_string(slot_bytes);
  if (h.hdr.len != h.len)
    return "slot header says " + std::to_string(h.hdr.len) + " bytes, frame " + std::to_string(h.len);
  if (h.before.seq != 0 && h.before.seq >= h.hdr.desc.seq)
    return "the call before collective #" + std::to_string(h.hdr.desc.seq) + " is #" + std::to_string(h.before.seq);
  if (h.hdr.offset > h.hdr.msg_bytes || h.hdr.msg_bytes - h.hdr.offset < h.len)
    return "slice [" + std::to_string(h.hdr.offset) + ", +" + std::to_string(h.len) + ") outside a " +
           std::to_string(h.hdr.msg_bytes) + "-byte message";
  return "";
}

struct TcpTransport::Conn {
  int fd = -1;
  int peer = -1;
  int lane = 0;
  // send side: the user fills slots, `flush` puts them on the socket
  std::vector<char> tx;
  std::atomic<uint64_t> committed{0};
  std::atomic<uint64_t> written{0};
  std::mutex tx_mu;  // guards the fields below and writing to fd
  FrameHeader tx_fh{};
  const char* tx_payload = nullptr;
  size_t tx_total = 0;  // bytes of the frame being written (0: none)
  size_t tx_off = 0;
  bool tx_data = false;
  std::deque<std::pair<FrameKind, std::string>> control;  // abort and board frames to send
  std::string control_out;                                // the one being sent
  // receive side: the I/O thread fills slots, the user releases them
  std::vector<char> rx;
  std::atomic<uint64_t> ready{0};
  std::atomic<uint64_t> released{0};
  uint64_t next = 0;  // the user's next frame
  std::atomic<bool> stalled{false};
  std::atomic<bool> resume{false};
  FrameHeader rx_fh{};
  size_t rx_got = 0;
  char control_in[kAbortBytes];
  // state
  std::atomic<bool> dead{false};
  bool closed = false;  // dead by a clean end of stream between frames (guarded by mu)
  mutable std::mutex mu;  // guards why, abort_text, boards
  std::string why;
  std::string abort_text;
  BoardEntry boards[kBoardRows] = {};  // what the peer said it waits in, by seq % kBoardRows
  uint64_t board_latest = 0;
};

TcpTransport::TcpTransport(int rank, int world, uint32_t slot_bytes, const TcpConfig& cfg, ShmTransport& shm)
    : rank_(rank), world_(world), slot_bytes_(slot_bytes), cfg_(cfg), shm_(shm) {
  if (cfg_.slots < 1) throw Error(ErrorKind::kInvalid, "TCP channels need at least one slot");
  stride_ = kSlotHeaderBytes + slot_bytes_;
  conns_.resize(static_cast<size_t>(world) * kNumLanes);
}

TcpTransport::~TcpTransport() {
  // NOTE: closing a socket that has unread input resets the connection, and a
  // reset drops what the peer has not yet received. So: everything committed
  // goes onto the sockets, then FIN, then we wait until the peer's kernel has
  // acknowledged every byte (reading and discarding what still comes in), and
  // only then close. Bounded: a peer that stopped reading gets a reset.
  Clock::time_point until = Clock::now() + std::chrono::seconds(5);
  auto flushed = [](Conn& c) {
    std::lock_guard<std::mutex> lk(c.tx_mu);
    return c.written.load() == c.committed.load() && c.tx_total == 0 && c.control.empty();
  };
  for (auto& c : conns_) {
    while (c && !c->dead.load() && !flushed(*c) && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  stop_.store(true);
  if (io_.joinable()) {
    wakeIo();
    io_.join();
  }
  for (auto& c : conns_)
    if (c) shutdown(c->fd, SHUT_WR);
  char sink[4096];
  for (auto& c : conns_) {
    if (!c) continue;
    int unacked = 0;
    while (!c->dead.load() && ioctl(c->fd, SIOCOUTQ, &unacked) == 0 && unacked > 0 && Clock::now() < until) {
      while (recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    while (recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
    }
    close(c->fd);
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (event_fd_ >= 0) close(event_fd_);
}

uint16_t TcpTransport::listen(const std::string& address) {
  sockaddr_storage ss;
  socklen_t len = toSockaddr(address, 0, ss);
  listen_fd_ = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throwSystemError("socket");
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&ss), len) != 0) throwSystemError("bind to " + address);
  if (::listen(listen_fd_, 2 * world_ + 16) != 0) throwSystemError("listen on " + address);
  setNonBlocking(listen_fd_);
  socklen_t sl = sizeof(ss);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &sl);
  return ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                       : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

void TcpTransport::connect(const std::vector<bool>& remote, const std::vector<std::string>& addrs,
                           const std::vector<int>& ports, const std::string& token, int64_t timeout_ms) {
  if (token.size() != kTokenBytes) throw Error(ErrorKind::kInvalid, "the job token must be 32 bytes");
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto hello = [&](int to, int lane) {
    Hello h{};
    h.magic = kHelloMagic;
    h.world = static_cast<uint32_t>(world_);
    h.from = rank_;
    h.to = to;
    h.lane = lane;
    h.slot_bytes = slot_bytes_;
    std::memcpy(h.token, token.data(), kTokenBytes);
    return h;
  };
  // Why a Hello from `from` (any when -1) must be refused ("" when it is fine).
  auto refuse = [&](const Hello& h, int from) -> std::string {
    if (h.magic != kHelloMagic || std::memcmp(h.token, token.data(), kTokenBytes) != 0)
      return "it did not present this job's token";
    if (h.world != static_cast<uint32_t>(world_) || h.to != rank_ || h.lane < 0 || h.lane >= kNumLanes ||
        h.from < 0 || h.from >= world_ || !remote[h.from] || (from >= 0 ? h.from != from : h.from <= rank_))
      return "its ranks, lane or world size do not match";
    if (h.slot_bytes != slot_bytes_) return "it uses another frame size (TILECOMM_TCP_FRAME_BYTES differs)";
    return "";
  };
  auto install = [&](int fd, int peer, int lane) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    addConn(fd, peer, lane);
  };

  // We dial the lower ranks; the higher ones dial us. A rank waits only on
  // lower ranks before it serves its own listener, so set-up cannot deadlock.
  for (int q = 0; q < rank_; ++q) {
    if (!remote[q]) continue;
    for (int lane = 0; lane < kNumLanes; ++lane) {
      sockaddr_storage ss;
      socklen_t len = toSockaddr(addrs[q], ports[q], ss);
      int fd = -1;
      std::string why;
      for (;;) {
        fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) throwSystemError("socket");
        int r = ::connect(fd, reinterpret_cast<sockaddr*>(&ss), len);
        if (r != 0 && errno == EINPROGRESS) {
          struct pollfd pf = {fd, POLLOUT, 0};
          poll(&pf, 1, static_cast<int>(std::min<int64_t>(msLeft(deadline), 60000)));
          int err = 0;
          socklen_t el = sizeof(err);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
          r = err == 0 && (pf.revents & POLLOUT) ? 0 : -1;
          errno = err ? err : ETIMEDOUT;
        }
        if (r == 0) break;
        why = std::strerror(errno);
        close(fd);
        if (msLeft(deadline) == 0)
          throw Error(ErrorKind::kTimeout, "cannot connect to " + peerName(q) + " at " + addrs[q] + ":" +
                                               std::to_string(ports[q]) + ": " + why);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      Hello out = hello(q, lane), in{};
      std::string err = ioExact(fd, reinterpret_cast<char*>(&out), sizeof(out), true, deadline);
      if (err.empty()) err = ioExact(fd, reinterpret_cast<char*>(&in), sizeof(in), false, deadline);
      if (err.empty()) err = refuse(in, q);
      if (!err.empty() || in.lane != lane) {
        close(fd);
        throw Error(ErrorKind::kPeerFailed, "set-up of the TCP connection to " + peerName(q) + " at " + addrs[q] +
                                                ":" + std::to_string(ports[q]) + " failed: " +
                                                (err.empty() ? "lane mismatch" : err));
      }
      install(fd, q, lane);
    }
  }
  int expected = 0;
  for (int q = rank_ + 1; q < world_; ++q) expected += remote[q] ? kNumLanes : 0;
  std::string refused;
  while (expected > 0) {
    struct pollfd pf = {listen_fd_, POLLIN, 0};
    if (msLeft(deadline) == 0)
      throw Error(ErrorKind::kTimeout, "timed out waiting for " + std::to_string(expected) +
                                           " TCP connection(s) from higher ranks" +
                                           (refused.empty() ? "" : " (refused: " + refused + ")"));
    if (poll(&pf, 1, static_cast<int>(std::min<int64_t>(msLeft(deadline), 1000))) <= 0) continue;
    sockaddr_storage from;
    socklen_t fl = sizeof(from);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &fl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    // NOTE: a stranger gets a short deadline, so it cannot hold set-up for long.
    Clock::time_point hello_by = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    Hello in{};
    std::string err = ioExact(fd, reinterpret_cast<char*>(&in), sizeof(in), false, hello_by);
    if (err.empty()) err = refuse(in, -1);
    if (err.empty() && conns_[in.from * kNumLanes + in.lane]) err = "a second connection for one lane";
    if (err.empty()) {
      Hello out = hello(in.from, in.lane);
      err = ioExact(fd, reinterpret_cast<char*>(&out), sizeof(out), true, hello_by);
    }
    if (!err.empty()) {
      refused += (refused.empty() ? "" : "; ") + err;
      close(fd);
      continue;
    }
    install(fd, in.from, in.lane);
    --expected;
  }
  // Nothing listens once every connection is up.
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;

  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || event_fd_ < 0) throwSystemError("epoll/eventfd");
  struct epoll_event ev {};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev);
  for (auto& c : conns_) {
    if (!c) continue;
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = c.get();
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev) != 0) throwSystemError("epoll_ctl");
  }
  io_ = std::thread([this] { ioLoop(); });
}

void TcpTransport::addConn(int fd, int peer, int lane) {
  auto c = std::make_unique<Conn>();
  c->fd = fd;
  c->peer = peer;
  c->lane = lane;
  c->tx.assign(cfg_.slots * stride_, 0);
  c->rx.assign(cfg_.slots * stride_, 0);
  conns_[peer * kNumLanes + lane] = std::move(c);
}

std::string TcpTransport::fuzzReceive(const std::string& bytes, uint32_t slot_bytes) {
  ShmTransport shm(0, 2, ShmConfig{1, 64});  // this rank's doorbell and abort word
  TcpTransport t(0, 2, slot_bytes, TcpConfig{2, slot_bytes}, shm);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) throwSystemError("socketpair");
  setNonBlocking(sv[0]);
  t.addConn(sv[0], 1, kCollLane);
  std::thread writer([&] {
    ioExact(sv[1], const_cast<char*>(bytes.data()), bytes.size(), true, Clock::now() + std::chrono::seconds(10));
    close(sv[1]);
  });
  Conn& c = t.conn(kCollLane, 1);
  volatile char sink = 0;
  while (!c.dead.load()) {
    t.readFrames(c);
    while (const Slot* s = t.tryRecvSlot(kCollLane, 1)) {  // what the executor would read
      if (s->hdr.len > slot_bytes) throw Error(ErrorKind::kSystem, "a published slot exceeds the slot size");
      for (uint32_t i = 0; i < s->hdr.len; ++i) sink = sink + ShmTransport::payload(s)[i];
      t.releaseRecv(kCollLane, 1);
    }
    struct pollfd pf = {c.fd, POLLIN, 0};
    poll(&pf, 1, 10);
  }
  shutdown(sv[0], SHUT_RDWR);  // a writer still blocked on a rejected stream returns
  writer.join();
  std::string why = t.failure(1);
  return why == peerName(1) + " closed the connection" ? "" : why;
}

Slot* TcpTransport::ringSlot(std::vector<char>& ring, uint64_t k) const {
  return reinterpret_cast<Slot*>(ring.data() + (k % cfg_.slots) * stride_);
}

Slot* TcpTransport::trySendSlot(int lane, int peer) {
  Conn& c = conn(lane, peer);
  uint64_t k = c.committed.load(std::memory_order_relaxed);
  if (k - c.written.load(std::memory_order_acquire) >= cfg_.slots) return nullptr;
  return ringSlot(c.tx, k);
}

void TcpTransport::commitSend(int lane, int peer) {
  Conn& c = conn(lane, peer);
  c.committed.fetch_add(1, std::memory_order_release);
  std::lock_guard<std::mutex> lk(c.tx_mu);
  flush(c);  // what the socket does not take now, the I/O thread writes (EPOLLOUT)
}

const Slot* TcpTransport::tryRecvSlot(int lane, int peer) {
  Conn& c = conn(lane, peer);
  Slot* s = ringSlot(c.rx, c.next);
  return s->seq.load(std::memory_order_acquire) == c.next + 1 ? s : nullptr;
}

void TcpTransport::releaseRecv(int lane, int peer) {
  Conn& c = conn(lane, peer);
  c.released.store(++c.next, std::memory_order_seq_cst);
  // NOTE: paired with readFrames: it marks `stalled` then re-reads `released`.
  if (c.stalled.load(std::memory_order_seq_cst) && c.stalled.exchange(false)) {
    c.resume.store(true);
    wakeIo();
  }
}

bool TcpTransport::flush(Conn& c) {
  bool freed = false;
  while (!c.dead.load(std::memory_order_relaxed)) {
    if (c.tx_total == 0) {
      uint64_t k = c.written.load(std::memory_order_relaxed);
      std::memset(&c.tx_fh, 0, sizeof(c.tx_fh));
      c.tx_fh.magic = kFrameMagic;
      c.tx_fh.lane = static_cast<uint8_t>(c.lane);
      c.tx_fh.seq = k;
      if (!c.control.empty()) {
        c.tx_fh.kind = c.control.front().first;
        c.control_out = std::move(c.control.front().second);
        c.control.pop_front();
        c.tx_fh.len = static_cast<uint32_t>(c.control_out.size());
        c.tx_payload = c.control_out.data();
        c.tx_data = false;
      } else if (k < c.committed.load(std::memory_order_acquire)) {
        const Slot* s = ringSlot(c.tx, k);
        c.tx_fh.kind = FrameKind::kData;
        c.tx_fh.len = s->hdr.len;
        c.tx_fh.hdr = s->hdr;
        if (uint64_t q = s->hdr.desc.seq; q > 1) {
          std::lock_guard<std::mutex> lk(calls_mu_);
          if (calls_[(q - 1) % kBoardRows].seq == q - 1) c.tx_fh.before = calls_[(q - 1) % kBoardRows];
        }
        c.tx_payload = ShmTransport::payload(s);
        c.tx_data = true;
      } else {
        break;
      }
      c.tx_total = sizeof(FrameHeader) + c.tx_fh.len;
      c.tx_off = 0;
    }
    struct iovec iov[2];
    int n = 0;
    if (c.tx_off < sizeof(FrameHeader)) {
      iov[n++] = {reinterpret_cast<char*>(&c.tx_fh) + c.tx_off, sizeof(FrameHeader) - c.tx_off};
      if (c.tx_fh.len) iov[n++] = {const_cast<char*>(c.tx_payload), c.tx_fh.len};
    } else {
      iov[n++] = {const_cast<char*>(c.tx_payload) + (c.tx_off - sizeof(FrameHeader)), c.tx_total - c.tx_off};
    }
    struct msghdr m {};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    ssize_t w = sendmsg(c.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) fail(c, std::string("sending failed: ") + std::strerror(errno));
      break;
    }
    c.tx_off += static_cast<size_t>(w);
    if (c.tx_off == c.tx_total) {
      c.tx_total = 0;
      if (c.tx_data) {
        c.written.fetch_add(1, std::memory_order_release);
        freed = true;
      }
    }
  }
  return freed;
}

bool TcpTransport::readFrames(Conn& c) {
  const size_t hsz = sizeof(FrameHeader);
  bool moved = false;
  while (!c.dead.load(std::memory_order_relaxed)) {
    uint64_t k = c.ready.load(std::memory_order_relaxed);
    if (c.rx_got == 0 && k - c.released.load(std::memory_order_acquire) >= cfg_.slots) {
      // The ring is full: stop reading until the user frees a slot (releaseRecv).
      c.stalled.store(true, std::memory_order_seq_cst);
      if (k - c.released.load(std::memory_order_seq_cst) >= cfg_.slots) return moved;
      c.stalled.store(false);
    }
    char* dst;
    size_t want;
    if (c.rx_got < hsz) {
      dst = reinterpret_cast<char*>(&c.rx_fh) + c.rx_got;
      want = hsz - c.rx_got;
    } else {
      char* base = c.rx_fh.kind == FrameKind::kData ? ShmTransport::payload(ringSlot(c.rx, k)) : c.control_in;
      dst = base + (c.rx_got - hsz);
      want = hsz + c.rx_fh.len - c.rx_got;
    }
    if (want > 0) {
      ssize_t r = recv(c.fd, dst, want, MSG_DONTWAIT);
      if (r == 0) {
        fail(c, peerName(c.peer) + " closed the connection", c.rx_got == 0);  // mid-frame: truncated
        return true;
      }
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
        fail(c, std::string("receiving failed: ") + std::strerror(errno));
        return true;
      }
      bool header_done = c.rx_got < hsz && c.rx_got + static_cast<size_t>(r) == hsz;
      c.rx_got += static_cast<size_t>(r);
      if (header_done) {
        std::string bad = checkFrame(c.rx_fh, c.lane, k, slot_bytes_);
        if (!bad.empty()) {
          fail(c, peerName(c.peer) + " sent a malformed frame (" + bad + "); nothing of it was used");
          return true;
        }
      }
    }
    if (c.rx_got < hsz || c.rx_got < hsz + c.rx_fh.len) continue;
    if (c.rx_fh.kind == FrameKind::kData) {
      if (c.rx_fh.before.seq != 0) {
        std::lock_guard<std::mutex> lk(c.mu);
        c.boards[c.rx_fh.before.seq % kBoardRows] = BoardEntry{c.rx_fh.before.seq, c.rx_fh.before};
      }
      Slot* s = ringSlot(c.rx, k);
      s->hdr = c.rx_fh.hdr;
      s->seq.store(k + 1, std::memory_order_release);
      c.ready.store(k + 1, std::memory_order_release);
    } else if (c.rx_fh.kind == FrameKind::kBoard) {
      BoardEntry e;
      std::memcpy(&e, c.control_in, sizeof(e));
      if (e.seq != 0 && e.seq == e.desc.seq) {  // else ignored: it names nothing
        std::lock_guard<std::mutex> lk(c.mu);
        c.boards[e.seq % kBoardRows] = e;
        c.board_latest = e.seq;
      }
    } else {
      {
        std::lock_guard<std::mutex> lk(c.mu);
        c.abort_text.assign(c.control_in, c.rx_fh.len);
      }
      shm_.noteAbort(c.peer);
    }
    c.rx_got = 0;
    moved = true;
  }
  return moved;
}

void TcpTransport::fail(Conn& c, const std::string& why, bool closed) {
  {
    std::lock_guard<std::mutex> lk(c.mu);
    if (c.dead.load()) return;
    c.why = why;
    c.closed = closed;
    c.dead.store(true, std::memory_order_release);
  }
  if (epoll_fd_ >= 0) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  // The peer learns at once (a reset) when the stream broke; a clean close stays clean.
  if (!closed) shutdown(c.fd, SHUT_RDWR);
  shm_.ringSelf();
}

void TcpTransport::wakeIo() {
  uint64_t one = 1;
  ssize_t r = write(event_fd_, &one, sizeof(one));
  (void)r;
}

void TcpTransport::ioLoop() {
  struct epoll_event evs[64];
  while (!stop_.load()) {
    int n = epoll_wait(epoll_fd_, evs, 64, 1000);
    bool moved = false;
    for (int i = 0; i < n; ++i) {
      auto* c = static_cast<Conn*>(evs[i].data.ptr);
      if (!c) {
        uint64_t v;
        ssize_t r = read(event_fd_, &v, sizeof(v));
        (void)r;
        for (auto& cc : conns_)
          if (cc && cc->resume.exchange(false)) moved |= readFrames(*cc);
        continue;
      }
      if (evs[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) {
        std::lock_guard<std::mutex> lk(c->tx_mu);
        moved |= flush(*c);
      }
      if (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) moved |= readFrames(*c);
    }
    if (moved) shm_.ringSelf();
  }
}

void TcpTransport::broadcastAbort(const std::string& msg) {
  for (auto& c : conns_) {
    if (!c || c->lane != kCollLane || c->dead.load()) continue;
    std::lock_guard<std::mutex> lk(c->tx_mu);
    c->control.emplace_back(FrameKind::kAbort, msg.substr(0, kAbortBytes));
    flush(*c);
  }
}

void TcpTransport::noteCall(const CollDesc& d) {
  std::lock_guard<std::mutex> lk(calls_mu_);
  calls_[d.seq % kBoardRows] = d;
}

void TcpTransport::broadcastBoard(const BoardEntry& e) {
  std::string raw(reinterpret_cast<const char*>(&e), sizeof(e));
  for (auto& c : conns_) {
    if (!c || c->lane != kCollLane || c->dead.load()) continue;
    std::lock_guard<std::mutex> lk(c->tx_mu);
    c->control.emplace_back(FrameKind::kBoard, raw);
    flush(*c);
  }
}

std::optional<BoardEntry> TcpTransport::peerBoard(int peer) const {
  const Conn& c = conn(kCollLane, peer);
  std::lock_guard<std::mutex> lk(c.mu);
  if (c.board_latest == 0) return std::nullopt;
  return c.boards[c.board_latest % kBoardRows];
}

std::optional<BoardEntry> TcpTransport::peerBoardAt(int peer, uint64_t seq) const {
  const Conn& c = conn(kCollLane, peer);
  std::lock_guard<std::mutex> lk(c.mu);
  const BoardEntry& e = c.boards[seq % kBoardRows];
  return e.seq == seq && seq != 0 ? std::optional<BoardEntry>(e) : std::nullopt;
}

std::string TcpTransport::peerError(int peer) const {
  const Conn& c = conn(kCollLane, peer);
  std::lock_guard<std::mutex> lk(c.mu);
  return c.abort_text.empty() ? "(no message)" : c.abort_text;
}

bool TcpTransport::peerDead(int peer, int lane) const {
  const Conn& c = conn(lane, peer);
  if (!c.dead.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lk(c.mu);
  // A clean close after the peer's last frame is not a failure until those frames are consumed.
  return !c.closed || c.ready.load(std::memory_order_acquire) == c.next;
}

std::string TcpTransport::failure(int peer) const {
  for (int lane = 0; lane < kNumLanes; ++lane) {
    const Conn& c = conn(lane, peer);
    std::lock_guard<std::mutex> lk(c.mu);
    if (!c.why.empty()) return c.why;
  }
  return "";
}

}  // namespace tilecomm::transport

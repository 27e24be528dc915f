#include "transport/shm.h"

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "kernels/wait.h"
#include "transport/segment.h"

namespace tilecomm {

void throwSystemError(const std::string& what) {
  throw Error(ErrorKind::kSystem, what + ": " + std::strerror(errno));
}

namespace transport {

namespace {
constexpr uint64_t kMagic = 0x746c636f6d6d3031ull;  // "tlcomm01"
constexpr uint32_t kVersion = 4;  // 4: the slot header's tag is 64 bits
constexpr size_t kErrorBytes = 1024;
}  // namespace

struct ShmTransport::SegHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t world;
  uint32_t rank;
  uint32_t slots;
  uint32_t slot_bytes;
  int64_t pid;
  alignas(64) std::atomic<uint32_t> doorbell;
  alignas(64) std::atomic<uint32_t> sleepers;
  alignas(64) std::atomic<uint64_t> arrivals;  // mailbox arrivals, used in rank 0's segment (Note [Mailbox])
  alignas(64) std::atomic<uint32_t> abort_from;  // rank + 1 of the first failed rank that told us
  std::atomic<uint32_t> error_len;               // set once error_msg is complete
  alignas(64) std::atomic<int64_t> alive_ns;  // steady-clock time this rank last ran a wait or a collective
  alignas(64) std::atomic<uint64_t> board_latest;  // sequence number of the latest call on the board
  struct Row {
    std::atomic<uint64_t> version;  // seqlock: odd while being written
    uint64_t seq;
    CollDesc desc;
  } board[kBoardRows];  // recent calls, by seq % kBoardRows
  alignas(64) char error_msg[kErrorBytes];
};

ShmTransport::ShmTransport(int rank, int world, const ShmConfig& cfg) : rank_(rank), world_(world), cfg_(cfg) {
  if (cfg_.slots < 1 || cfg_.slot_bytes < 64 || cfg_.slot_bytes % 64 != 0)
    throw Error(ErrorKind::kInvalid, "shared-memory slots must be >= 1 and slot bytes a multiple of 64");
  slot_stride_ = kSlotHeaderBytes + cfg_.slot_bytes;
  channel_stride_ = 64 + cfg_.slots * slot_stride_;
  size_t header_bytes = (sizeof(SegHeader) + 63) / 64 * 64;
  seg_bytes_ = header_bytes + 2 * slot_stride_ + static_cast<size_t>(world) * kNumLanes * channel_stride_;
  sent_.assign(kNumLanes * world, 0);
  recvd_.assign(kNumLanes * world, 0);
  bases_.assign(world, nullptr);
  pidfds_.assign(world, -1);
  pids_.assign(world, 0);

  Segment own = createSegment(seg_bytes_);
  name_ = own.name;
  bases_[rank] = own.base;
  auto* h = new (own.base) SegHeader();
  h->version = kVersion;
  h->world = world;
  h->rank = rank;
  h->slots = cfg_.slots;
  h->slot_bytes = cfg_.slot_bytes;
  h->pid = getpid();
  pids_[rank] = getpid();
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
}

ShmTransport::~ShmTransport() {
  if (!unlinked_ && !name_.empty()) unlinkSegment(name_);
  for (char* b : bases_)
    if (b) munmap(b, seg_bytes_);
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
}

void ShmTransport::connect(const std::vector<std::string>& names, const std::vector<int64_t>& pids,
                           const std::vector<bool>& local) {
  if (static_cast<int>(names.size()) != world_ || static_cast<int>(pids.size()) != world_ ||
      static_cast<int>(local.size()) != world_)
    throw Error(ErrorKind::kInvalid, "connect: expected one segment name, pid and link per rank");
  for (int r = 0; r < world_; ++r) {
    pids_[r] = pids[r];
    if (r == rank_ || !local[r]) continue;
    bases_[r] = openSegment(names[r], seg_bytes_, "rank " + std::to_string(r) + "'s shared-memory segment",
                            " (do all ranks use the same TILECOMM_SHM_* settings?)")
                    .base;
    SegHeader* h = header(r);
    if (h->magic != kMagic || h->version != kVersion || h->world != static_cast<uint32_t>(world_) ||
        h->rank != static_cast<uint32_t>(r) || h->slots != cfg_.slots || h->slot_bytes != cfg_.slot_bytes)
      throw Error(ErrorKind::kInvalid, "rank " + std::to_string(r) + "'s shared-memory segment does not match");
    pidfds_[r] = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pids[r]), 0));
  }
}

void ShmTransport::unlinkOwn() {
  if (!unlinked_) unlinkSegment(name_);
  unlinked_ = true;
}

ShmTransport::SegHeader* ShmTransport::header(int r) const { return reinterpret_cast<SegHeader*>(bases_[r]); }

char* ShmTransport::channelBase(int owner) const {
  size_t header_bytes = (sizeof(SegHeader) + 63) / 64 * 64;
  return bases_[owner] + header_bytes + 2 * slot_stride_;
}

std::atomic<uint64_t>* ShmTransport::consumed(int owner, int src, int lane) const {
  char* ch = channelBase(owner) + (static_cast<size_t>(src) * kNumLanes + lane) * channel_stride_;
  return reinterpret_cast<std::atomic<uint64_t>*>(ch);
}

Slot* ShmTransport::slot(int owner, int src, int lane, uint64_t k) const {
  char* ch = reinterpret_cast<char*>(consumed(owner, src, lane));
  return reinterpret_cast<Slot*>(ch + 64 + (k % cfg_.slots) * slot_stride_);
}

Slot* ShmTransport::trySendSlot(int lane, int peer) {
  uint64_t k = sent_[lane * world_ + peer];
  // NOTE: the receiver frees slots in order; k - consumed < slots means slot k is free.
  if (k - consumed(peer, rank_, lane)->load(std::memory_order_acquire) >= cfg_.slots) return nullptr;
  return slot(peer, rank_, lane, k);
}

void ShmTransport::commitSend(int lane, int peer) {
  uint64_t& k = sent_[lane * world_ + peer];
  slot(peer, rank_, lane, k)->seq.store(k + 1, std::memory_order_release);
  ++k;
  ring(peer);
}

const Slot* ShmTransport::tryRecvSlot(int lane, int peer) {
  uint64_t k = recvd_[lane * world_ + peer];
  Slot* s = slot(rank_, peer, lane, k);
  return s->seq.load(std::memory_order_acquire) == k + 1 ? s : nullptr;
}

void ShmTransport::releaseRecv(int lane, int peer) {
  uint64_t& k = recvd_[lane * world_ + peer];
  ++k;
  consumed(rank_, peer, lane)->store(k, std::memory_order_release);
  ring(peer);
}

Slot* ShmTransport::mailbox(int owner, uint64_t round) const {
  return reinterpret_cast<Slot*>(channelBase(owner) - (2 - round % 2) * slot_stride_);
}

void ShmTransport::arrive(uint64_t round) {
  mailbox(rank_, round)->seq.store(round, std::memory_order_release);
  uint64_t n = header(0)->arrivals.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (n == round * static_cast<uint64_t>(world_)) {
    for (int r = 0; r < world_; ++r)
      if (r != rank_) ring(r);
  }
}

bool ShmTransport::allArrived(uint64_t round) const {
  return header(0)->arrivals.load(std::memory_order_acquire) >= round * static_cast<uint64_t>(world_);
}

void ShmTransport::ring(int peer) {
  SegHeader* h = header(peer);
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h->sleepers.load(std::memory_order_seq_cst) != 0) kernels::futexWakeAll(&h->doorbell);
}

uint32_t ShmTransport::announce() {
  SegHeader* h = header(rank_);
  h->sleepers.fetch_add(1, std::memory_order_seq_cst);
  return h->doorbell.load(std::memory_order_seq_cst);
}

void ShmTransport::sleep(uint32_t token, int64_t timeout_us) {
  kernels::futexWait(&header(rank_)->doorbell, token, timeout_us);
}

void ShmTransport::unannounce() { header(rank_)->sleepers.fetch_sub(1, std::memory_order_seq_cst); }

void ShmTransport::wakeSelf() {
  SegHeader* h = header(rank_);
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  kernels::futexWakeAll(&h->doorbell);
}

int ShmTransport::abortedBy() const { return static_cast<int>(header(rank_)->abort_from.load(std::memory_order_acquire)); }

std::string ShmTransport::peerError(int peer) const {
  SegHeader* h = header(peer);
  uint32_t n = h->error_len.load(std::memory_order_acquire);
  if (n == 0 || n > kErrorBytes) return "(no message)";
  return std::string(h->error_msg, n);
}

void ShmTransport::broadcastAbort(const std::string& msg) {
  SegHeader* me = header(rank_);
  uint32_t expected = 0;
  if (me->error_len.load() == 0) {
    size_t n = std::min(msg.size(), kErrorBytes);
    std::memcpy(me->error_msg, msg.data(), n);
    me->error_len.compare_exchange_strong(expected, static_cast<uint32_t>(n), std::memory_order_release);
  }
  for (int r = 0; r < world_; ++r) {
    if (r == rank_ || !bases_[r]) continue;
    uint32_t none = 0;
    header(r)->abort_from.compare_exchange_strong(none, static_cast<uint32_t>(rank_ + 1));
    ring(r);
  }
}

void ShmTransport::noteAbort(int peer) {
  uint32_t none = 0;
  header(rank_)->abort_from.compare_exchange_strong(none, static_cast<uint32_t>(peer + 1));
  wakeSelf();
}

bool ShmTransport::peerDead(int r) const {
  if (pidfds_[r] >= 0) {
    struct pollfd p = {pidfds_[r], POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }
  return pids_[r] > 0 && kill(static_cast<pid_t>(pids_[r]), 0) != 0 && errno == ESRCH;
}

int64_t ShmTransport::nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void ShmTransport::heartbeat() { header(rank_)->alive_ns.store(nowNs(), std::memory_order_relaxed); }

int64_t ShmTransport::lastAlive(int peer) const { return header(peer)->alive_ns.load(std::memory_order_relaxed); }

void ShmTransport::publishBoard(const CollDesc& d) {
  SegHeader* h = header(rank_);
  SegHeader::Row& row = h->board[d.seq % kBoardRows];
  uint64_t v = row.version.load(std::memory_order_relaxed);
  row.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  row.desc = d;
  row.seq = d.seq;
  row.version.store(v + 2, std::memory_order_release);
  h->board_latest.store(d.seq, std::memory_order_release);
}

std::optional<BoardEntry> ShmTransport::readBoardAt(int peer, uint64_t seq) const {
  SegHeader::Row& row = header(peer)->board[seq % kBoardRows];
  // NOTE: bounded: a peer stopped (or killed) inside publishBoard leaves the row odd.
  for (int tries = 0; tries < 100000; ++tries) {
    uint64_t v1 = row.version.load(std::memory_order_acquire);
    BoardEntry e{row.seq, row.desc};
    std::atomic_thread_fence(std::memory_order_acquire);
    if (v1 % 2 == 0 && row.version.load(std::memory_order_relaxed) == v1)
      return e.seq == seq ? std::optional<BoardEntry>(e) : std::nullopt;
  }
  return std::nullopt;
}

BoardEntry ShmTransport::readBoard(int peer) const {
  for (int tries = 0; tries < 100; ++tries) {
    uint64_t latest = header(peer)->board_latest.load(std::memory_order_acquire);
    if (latest == 0) break;
    if (std::optional<BoardEntry> e = readBoardAt(peer, latest)) return *e;  // else overwritten meanwhile: again
  }
  return BoardEntry{0, CollDesc{}};
}

}  // namespace transport
}  // namespace tilecomm

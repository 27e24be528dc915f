// The GPU peer transport: ranks of one host whose kernels load and store each
// other's memory. Each rank makes one area (sequence flags and counter, two
// staging buffers, two LL buffers; with cuda_ipc and host_mapped also the
// schedule executor's FIFOs) in one of three kinds of memory:
// - cuda_ipc (cuda_ipc.h): in its GPU's memory, opened by peers through CUDA
//   IPC; needs peer access between the GPUs (or ranks sharing one GPU);
// - host_mapped (host_mapped.h): in a shared-memory segment of the host that
//   every process registers with its GPU; for GPUs without peer access (PCIe);
// - nvshmem (nvshmem.h): on NVSHMEM's symmetric heap (a collective allocation),
//   peers' areas addressed through nvshmem_ptr; a peer without such an address
//   is reached only through NVSHMEM's put-with-signal (base[q] is null).
// The handles (IPC handles or segment names) are exchanged once per group
// through the c10d Store by the caller. The transport knows no collective: the
// direct kernels (allreduce_*.cu, allgather_*.cu, reducescatter_*.cu) give the
// flags and buffers their meaning, and run unchanged over any kind.
//
// Note [Device sequence]: every direct call has a sequence number s (from 1),
// the same on every rank because every rank makes the same direct calls in the
// same order. It lives in device memory (SeqCounter), not in a kernel argument:
// each kernel reads s = counter.seq + 1 at its start, and once every one of its
// blocks has read it, one of them stores counter.seq = s. So a kernel captured
// in a CUDA graph gets a fresh s at every replay. counter.done = s says "my
// kernels up to call s have ended" (PeerTransport::drain and the schedule
// executor's and the all_to_all's FIFO kernels wait for peers' values): the last
// block of a kernel to finish stores it, or, for an awaited kernel (Note
// [Awaited calls] in primitives.cuh), the next kernel: block 0 at its start if
// it is awaited or a FIFO kernel, else its last block at its end.
//
// Note [Flags]: a flag holds the sequence number of the last direct call whose
// phase it announces. Values only grow (the area is zeroed once, at creation,
// and never reset), so a waiter asks "flag >= my call's sequence number" and a
// stale flag can never look fresh. LL lines (primitives.cuh) carry a 32-bit
// flag derived from s the same way.
//
// Note [Staging parity]: call s uses staging buffer s % 2 and LL buffer s % 2.
// A rank writes buffer s % 2 (its own staging buffer, or its LL slot in a
// peer's LL buffer) again only at call s + 2 or later, and it starts that call
// after its kernel of call s + 1 ended, which waited for every peer's part of
// call s + 1, which every peer produced after its kernel of call s ended (one
// stream runs one kernel at a time): so no peer still reads the buffer.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/host_mapped.h"

namespace tilecomm::cuda {

constexpr int kMaxRanks = 16;    // a larger group uses the staged path
constexpr int kMaxBlocks = 128;  // thread blocks of one simple direct kernel (each has its own flags)
// Flags per block: phase 0 (input staged), 1 (two_shot: reduced part staged).
constexpr int kPhases = 2;
// The largest message an LL kernel carries per rank (bytes of data; its LL lines take twice that).
constexpr uint64_t kLLMaxBytes = 1u << 20;

/// Base addresses of every rank's area, as this process sees them (own: its pointer).
struct PeerTable {
  char* base[kMaxRanks];
};

/// Where the ranks' areas live (the order of cuda_model.MEMORIES).
enum class PeerMemory : int { kCudaIpc = 0, kHostMapped, kNvshmem };
constexpr int kMemories = 3;
const char* peerMemoryName(PeerMemory m);  // "cuda_ipc" | "host_mapped" | "nvshmem"

/// What a direct kernel ran, for error messages.
enum class KernelKind : int {
  kAllReduce = 0,
  kAllReduceLL,
  kAllGatherLL,
  kAllGather,
  kReduceScatter,
  kSchedule,
  kAllToAll,
};

/// Why a kernel stopped waiting.
enum class WaitFailure : int {
  kTimeout = 0,
  kPeerDied,
  kMismatch,  // the schedule executor met a peer's slice of another call (Note [Schedule executor])
};

/// What a failed wait last read where it waited (KernelError::seen).
enum class Seen : int {
  kNothing = 0,  // not recorded (FIFO words, a dead peer)
  kFlag,         // a peer's flag: the last call whose phase it announced (Note [Flags])
  kLLFlag,       // a peer's LL line: its flag word, llFlag of the call that wrote it (0: never written)
};

/// Written by a kernel whose wait failed (in mapped pinned host memory), and the host's
/// watchdog word that makes waits give up (Note [GPU watchdog]).
struct KernelError {
  unsigned int claimed;  // 0 -> 1 by the first failing thread
  unsigned int ready;    // 1 once the fields below are written
  int peer;              // the rank waited for (kTimeout) or the rank that died (kPeerDied)
  int kind;              // KernelKind
  int reason;            // WaitFailure
  unsigned long long seq;     // the direct call's sequence number (Note [Device sequence])
  unsigned long long launch;  // the host's launch id of the kernel (frozen in a CUDA graph)
  unsigned long long waited_ns;
  unsigned int dead_ranks;  // written by the host: bit r set once rank r's process exited
  int block;                // the thread block whose wait failed
  int seen_kind;            // Seen
  unsigned long long seen;  // what that wait last read (seen_kind says what it is)
};

/// This rank's call counter (Note [Device sequence]); only its own kernels touch it.
struct SeqCounter {
  unsigned long long seq;      // the last call whose kernel has run on this rank (all its blocks began)
  unsigned long long blocks;   // thread blocks of all those kernels (read with seq: keep them together)
  unsigned long long arrived;  // thread blocks counted (atomically) so far
  unsigned long long done;     // every kernel of this rank up to this call has ended
};

/// Byte offsets inside an area: [flags | counter | source and destination offsets] [push flags] [staging 0]
/// [staging 1] [LL 0] [LL 1]; an LL buffer holds one slot per rank of 2 x ll_capacity bytes
/// (16-byte lines carrying 8 data bytes).
constexpr uint64_t kCounterOffset = kPhases * kMaxBlocks * sizeof(uint64_t);
constexpr uint64_t kSourceOffset = kCounterOffset + 64;
static_assert(sizeof(SeqCounter) <= 64 && kCounterOffset % 16 == 0, "the counter: 16-byte aligned, before the source offsets");
constexpr uint64_t kPushOffset = 4096;
constexpr uint64_t kFlagBytes = kPushOffset + kMaxRanks * kMaxBlocks * sizeof(uint64_t);
constexpr uint64_t kDestOffset = kSourceOffset + 2 * sizeof(int64_t);
static_assert(kDestOffset + 2 * sizeof(int64_t) <= kPushOffset, "flags, counter and offsets must fit their page");
/// This rank's flag of a phase and thread block: "my part of call <value> is ready" (peers poll it).
__host__ __device__ inline uint64_t* flagOf(char* base, int phase, int block) {
  return reinterpret_cast<uint64_t*>(base) + phase * kMaxBlocks + block;
}
__host__ __device__ inline SeqCounter* counterOf(char* base) {
  return reinterpret_cast<SeqCounter*>(base + kCounterOffset);
}
/// Note [Push flags]: in rank q's area, the flag that rank src raises (a remote store, or
/// NVSHMEM's put-with-signal) once its data of call <value> for this block is in q's memory (its
/// staging buffer, or for the two-shot's phase 1 its tensor or in-place copy); q polls its own
/// memory.
__host__ __device__ inline uint64_t* pushFlagOf(char* base, int src, int block) {
  return reinterpret_cast<uint64_t*>(base + kPushOffset) + src * kMaxBlocks + block;
}
/// Where this rank's input of call seq lies, as a byte offset from its area's base on the
/// symmetric heap (peers read it there, in place), or kStagedSource: in its staging buffer.
constexpr int64_t kStagedSource = INT64_MIN;
/// Registered tensors (Note [Registered tensors] in backend/cuda_glue.hpp), as the source of the
/// all_reduce two-shot or the destination of the all_gather push: every rank's tensor is read or
/// written in place through the addresses the host mapped (BlockArgs::tensor), not through
/// sourceOf() / destOf().
constexpr int64_t kRegisteredSource = INT64_MIN + 1;
__host__ __device__ inline int64_t* sourceOf(char* base, uint64_t seq) {
  return reinterpret_cast<int64_t*>(base + kSourceOffset) + (seq & 1);
}
/// Where this rank's output of call seq lies (all_gather push), as sourceOf: peers store their
/// blocks there, in place, or (kStagedSource) into its staging buffer.
__host__ __device__ inline int64_t* destOf(char* base, uint64_t seq) {
  return reinterpret_cast<int64_t*>(base + kDestOffset) + (seq & 1);
}
__host__ __device__ inline char* stagingOf(char* base, uint64_t capacity, uint64_t seq) {
  return base + kFlagBytes + (seq & 1) * capacity;
}
__host__ __device__ inline char* llSlotOf(char* base, uint64_t capacity, uint64_t ll_capacity, int world,
                                          uint64_t seq, int slot) {
  return base + kFlagBytes + 2 * capacity + ((seq & 1) * world + slot) * 2 * ll_capacity;
}

// The schedule executor's region (Note [Schedule executor] in schedule_executor.h), after the LL
// buffers of cuda_ipc and host_mapped areas: control words, then one FIFO of kSchedSlots slots
// per (source rank, channel), each slot a header line and kSchedSlotBytes of data.
constexpr int kSchedChannels = 8;
constexpr int kSchedSlots = 4;
constexpr uint64_t kSchedSlotBytes = 32u << 10;
constexpr uint64_t kSchedHeaderBytes = 128;
constexpr uint64_t kSchedSlotStride = kSchedHeaderBytes + kSchedSlotBytes;
constexpr int kSchedLanes = 32;  // exec::kDeviceMaxLanes
/// Control words (uint64 each): sent[src][c] (raised by src), freed[dst][c] (raised by dst),
/// this rank's own counts of slices sent to and taken from each peer, lanes' progress, barrier.
enum SchedWord : uint64_t {
  kSchedSent = 0,
  kSchedFreed = kSchedSent + kMaxRanks * kSchedChannels,
  kSchedOwnSent = kSchedFreed + kMaxRanks * kSchedChannels,
  kSchedOwnTaken = kSchedOwnSent + kMaxRanks * kSchedChannels,
  kSchedProgress = kSchedOwnTaken + kMaxRanks * kSchedChannels,
  kSchedBarrier = kSchedProgress + kSchedLanes * kSchedChannels,
  kSchedBarrierBase = kSchedBarrier + 16,  // own 128-byte line
  kSchedWords = kSchedBarrierBase + 16,
};
constexpr uint64_t kSchedControlBytes = 8192;
static_assert(kSchedWords * sizeof(uint64_t) <= kSchedControlBytes, "executor control words must fit");
__host__ __device__ inline uint64_t schedRegionBytes(int world) {
  return kSchedControlBytes + static_cast<uint64_t>(world) * kSchedChannels * kSchedSlots * kSchedSlotStride;
}

// Note [GPU watchdog]: a peer that dies mid-kernel would leave the others'
// kernels waiting until the group timeout (30 minutes by default). The host
// watches the peers' processes (CudaGroup's watchdog thread) and, when one has
// exited, sets its bit in the mapped host word KernelError::dead_ranks; every
// wait loop reads it every few hundred polls and gives up, recording which rank
// died, so the kernel ends and the host raises an error naming the rank. The
// host launches no direct kernel after that, and never reads a dead rank's area
// again (drain skips it). A kernel replayed from a CUDA graph after a death, or
// launched in the watchdog's 20 ms before it noticed, still writes its sends
// into every peer's area before it waits.

class PeerTransport {
 public:
  /// Makes and zeroes this rank's area of kind `memory` for `device` (capacity: bytes per
  /// staging buffer, ll_capacity: largest LL message per rank, both rounded up to 256). Throws
  /// tilecomm::Error on a CUDA or system failure.
  PeerTransport(PeerMemory memory, int rank, int world, int device, uint64_t capacity, uint64_t ll_capacity,
                cudaStream_t stream);
  ~PeerTransport();
  PeerTransport(const PeerTransport&) = delete;
  PeerTransport& operator=(const PeerTransport&) = delete;

  /// What peers need to open this area: an IPC handle's bytes, or a segment name ("" for nvshmem).
  std::string exportHandle() const;
  /// Opens every peer's area from its handle (own entry ignored; nvshmem: from nvshmem_ptr, and
  /// a peer without a peer address stays null). Returns "" or why it failed.
  std::string open(const std::vector<std::string>& handles);
  /// Whether this rank loads and stores every peer's area (nvshmem: every nvshmem_ptr was set).
  bool allDirect() const;
  /// The sequence number of the next call over the transport, counted by the host (for calls
  /// driven from the host, which cannot read the device counter; never under CUDA graphs).
  uint64_t nextCall() { return ++calls_; }
  /// host_mapped: unlinks this rank's segment (once every peer opened it). No-op for cuda_ipc.
  void unlinkOwn();
  PeerMemory memory() const { return memory_; }

  int rank() const { return rank_; }
  int world() const { return world_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t llCapacity() const { return ll_capacity_; }
  /// Where the schedule executor's region begins in every rank's area (0: none, nvshmem).
  uint64_t schedOffset() const { return memory_ == PeerMemory::kNvshmem ? 0 : ll_end_; }
  /// Thread blocks one rank's kernel may use (Note [Block budget]): the ranks' spinning kernels
  /// must all be resident at once when they share a GPU, so together they take at most one block
  /// per SM.
  int blockBudget() const { return block_budget_; }
  /// Lowers the budget to `agreed`, the smallest of the ranks' (the simple and block kernels' grids,
  /// and which kernels run, depend on it, so every rank must use the same: Note [Block budget]).
  void agreeBudget(int agreed) { block_budget_ = std::max(1, std::min(block_budget_, agreed)); }
  const PeerTable& peers() const { return peers_; }
  /// Note [Fence scope]: whether every rank's area is memory of this rank's own GPU (cuda_ipc or
  /// NVSHMEM's heap, all ranks on one GPU), so that the kernels publish to peers with GPU-scope fences.
  bool oneGpu() const { return one_gpu_; }
  void setOneGpu(bool v) { one_gpu_ = v && memory_ != PeerMemory::kHostMapped; }
  /// Launch id of the next direct kernel launched from the host (from 1). A kernel replayed from
  /// a CUDA graph keeps the id it was captured with; sequence numbers come from the device.
  uint64_t nextLaunch() { return ++launches_; }
  /// Before the area is freed: waits (at most timeout_ms) until every peer's kernel of this
  /// rank's last direct call ended, or, after an awaited call, of the call before it (Note
  /// [Awaited calls] in primitives.cuh): peers are then done with this rank's memory. The stream
  /// must be idle.
  void drain(int64_t timeout_ms);
  KernelError* errorForDevice() const { return err_dev_; }
  /// Launch id of the first direct kernel whose wait failed, 0 if none.
  uint64_t failedLaunch() const;
  /// What failed, naming the rank waited for or the rank that died ("" if nothing did).
  std::string errorText() const;
  /// Note [GPU watchdog]: peer's process exited (`note` says how); waits give up from now on.
  void peerDied(int peer, const std::string& note);
  bool isDead(int peer) const;
  /// The note of the first peer that died ("" while none has).
  std::string deathNote() const;

 private:
  void releaseOwn();  // this rank's area and error record (the current device is ours)
  uint64_t areaBytes() const;

  PeerMemory memory_;
  int rank_;
  int world_;
  int device_;
  uint64_t capacity_;
  uint64_t ll_capacity_;
  uint64_t ll_end_;  // where the LL buffers end (the executor's region begins)
  int block_budget_ = 1;
  bool one_gpu_ = false;
  uint64_t launches_ = 0;
  uint64_t calls_ = 0;
  char* own_ = nullptr;           // this rank's area as its GPU addresses it
  HostArea own_host_;             // host_mapped: its segment
  PeerTable peers_{};
  std::vector<char*> opened_;     // cuda_ipc: peers' areas
  std::vector<HostArea> opened_host_;  // host_mapped: peers' segments
  // nvshmem: own_ is never freed (Note [NVSHMEM lifetime] in nvshmem.h)
  mutable std::mutex mu_;  // death_note_
  std::string death_note_;
  KernelError* err_host_ = nullptr;
  KernelError* err_dev_ = nullptr;
};

}  // namespace tilecomm::cuda

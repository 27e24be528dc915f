// CUDA tensors in the c10d glue (built only when torch has CUDA).
//
// Note [CUDA streams]: NCCL's contract. At issue, on the caller's thread, an
// operation records a `ready` event on the caller's current stream. When its
// turn comes (Note [Issue order]), its GPU work goes to the group's internal
// stream, which first waits on `ready`: either a direct kernel over the peer
// transport (cuda_ipc or host_mapped; all_reduce, LL all_gather up to the LL
// buffer) or over the NVSHMEM transport (all_gather, reduce_scatter: blocks.h),
// or the collective's schedule walked by the GPU's schedule executor (Note
// [Schedule executor] in cuda/schedule_executor.h), or the staged path: copies
// to pinned host memory, the CPU engine's collective over them, copies back.
// Then an `end` event is recorded on the internal stream and the tensors are
// marked used by it (recordStream), so the caching allocator never hands their
// memory out before the stream is done with them. The events are raw CUDA
// events from the group's pool (EventPool), recorded and waited on with plain
// runtime calls: one capture query per operation (at issue), no event created
// or destroyed per operation, and wait() queries `end` only when a direct
// kernel of the group has failed. work.wait() makes the
// caller's current stream wait on `end` and does not block the CPU on GPU
// work (only on the host part of a staged operation, which has to run first);
// the Work's Future, made when first asked for, is device-aware and its events
// are recorded on the operation's stream after it. A group's collectives run
// in issue order on the GPU (Note [Stream order]), so several in flight on a
// group are ordered the same way on every rank.
//
// Note [Synchronous CUDA calls]: a collective called with async_op=False whose GPU work may be a
// direct kernel, the schedule executor's or the all_to_all kernels (every collective) runs on the
// caller's current stream instead, as ProcessGroupNCCL does in that mode: the caller's stream
// orders it with what comes before and after, so it needs no `ready` event, no stream waits and
// no recordStream (tensors are used on the caller's stream, as by any torch operation on it).
// Its `end` event is still recorded, on that stream, so that its Work answers is_completed(),
// wait() from another stream and a failed kernel as before, and the next collective on another
// stream can wait on it. Should such a call fall back to the staged path (no peer transport), it
// is staged on the caller's stream. Asynchronous calls, the other staged calls and
// point-to-point keep the internal stream.
//
// Note [Guards where needed]: a CUDA call sets the op's device and stream only where they are not
// current already. A synchronous call runs on the caller's thread, on the caller's stream, where
// both already are; a c10 device guard's exit asks the driver whether the device has a primary
// context, and the three guards of such a call cost about 1 us of its host time (an H100 under MPS,
// docs/benchmarks.md). An asynchronous call's task (on the engine's thread), or a call on the
// internal stream or on another device, sets what differs.
//
// Note [CUDA graphs]: an operation issued while the caller's stream is being
// captured is captured too: an asynchronous one's `ready` forks the internal
// stream into the capture, and `end` joins it back when the caller waits
// (wait() never queries a captured event); a synchronous one is captured on the
// caller's stream itself. Only direct and executor kernels can be captured (they take no per-call
// value from the host, Note [Device sequence]; NVSHMEM's: Note [NVSHMEM capture] in cuda_glue.cpp);
// a staged operation under capture raises a
// ValueError at the call, and so does the group's first direct call (it sets up
// the transport through the Store and cudaMalloc): run one before capturing.
//
// Note [Registered tensors]: a staged direct all_reduce first copies the caller's tensor into the
// transport's staging buffer, because peers reach only memory that was exported and opened; that
// copy in and the copy out make a two-shot move about 5n bytes per rank where the reduction needs
// 2n. Over cuda_ipc, an all_reduce of at least TILECOMM_CUDA_REGISTER_BYTES (captured in a CUDA
// graph, of at least TILECOMM_CUDA_CAPTURE_REGISTER_BYTES, below; or every size with
// TILECOMM_CUDA_ALLREDUCE=registered) registers the tensors instead: each rank exports the
// allocation that holds its whole tensor (cudaIpcGetMemHandle, until every peer has opened it),
// the ranks exchange {handle, allocation address and unique id, offset} with an all_gather of the
// CPU engine, each opens what it has not opened yet (cudaIpcOpenMemHandle, cached per (rank,
// allocation address); a new id at a known address means the old allocation was freed: its
// mapping is closed), and the two-shot reads and stores every rank's tensor in place
// (cuda/blocks.h, allReduceRegistered). all_gather does the same with its output where that is one range
// (all_gather_into_tensor) of at least TILECOMM_CUDA_REGISTER_BYTES above the LL limit (with
// TILECOMM_PROTO=auto, all_gather_into_tensor above the CUDA model's crossover with LL too), unless
// TILECOMM_ALGO forces an all_gather algorithm: each rank stores its block straight into every
// rank's output (allgather_nvshmem_push.cu over cuda_ipc: n read, p x n written). With
// TILECOMM_CUDA_ALLTOALL=registered, an all_to_all_single of equal blocks does the same with its
// output (alltoall_push.cu: each rank stores block q into block `rank` of rank q's output).
//
// The exchange carries each rank's extent too: ranks whose extents differ (a collective mismatch)
// all throw. The decision is the same on every rank: where some rank's tensor cannot be exported (not within
// one cudaMalloc allocation: expandable segments, pool memory) or some rank could not open a
// peer's, every rank takes the other path. A second all_gather (of one byte: opened or not)
// follows only when some rank exported an allocation for the first time; one that every peer
// opened before is marked known, and peers never close a mapping of it while it lives.
//
// Limits. Mappings of a peer's freed allocations stay open until that address is reused or the
// group ends, so the GPU memory behind them is not returned to the driver before. CUDA documents
// freeing an exported allocation while an importer still has it open as undefined; tilecomm
// relies on the driver keeping such memory alive until the peers close it (the caching allocator
// frees segments only in empty_cache and when it retries an allocation that ran out of memory);
// TILECOMM_CUDA_REGISTER_BYTES=0 turns registration off. Every rank passes through the CPU
// engine's all_gather before its launch, so the calling thread (the worker's, for async_op=True)
// waits there until every rank issued the call. Under CUDA graph capture the exchange and the
// opening run once, at the capture (host work, which the graph does not record; RelaxedCapture lets
// the thread export and open memory where torch's capture forbids it), and every replay's kernel
// reads the peers' tensors at the addresses captured. Those stay valid while the peers' graphs
// live: a graph's tensors stay where they are (torch's graph pool), as any replay needs; a
// mapping replaced during a capture is retired, not closed (no stream can be synchronized then).
// Since the exchange is paid once there, a captured all_reduce registers from a smaller size,
// TILECOMM_CUDA_CAPTURE_REGISTER_BYTES (1 MiB; eager calls from 4 MiB, where the exchange on every
// call costs more than the staging copies it saves below a few MiB). That decision depends on the
// capture, so every rank must capture the call. Where some do not, a rank that registers waits
// in the exchange for peers that launched the staged kernel; a peer's next exchange (a later
// registering call) would pair with it, so each rank's export carries the number of collectives it
// issued before this one (c10d's sequence number, the same on every rank that issues the same
// collectives), and ranks whose numbers differ all throw a collective mismatch; with no later
// exchange, both end at the group timeout.
// A peer that stalls past the timeout inside a registered kernel may still store into a rank's
// tensor after that rank's call failed; the group fails every later call.
//
// Note [Direct point-to-point]: with TILECOMM_CUDA_P2P=direct (the default), in a group whose
// ranks are on one host, with GPU peer memory possible (TILECOMM_CUDA_IPC_BYTES > 0), no
// TILECOMM_TRANSPORT=host_mapped and no GPU pair of the host that NVML reports without peer
// access (p2pDirect: the same answer on every rank), send and recv of CUDA tensors move the bytes
// GPU to GPU. Their GPU
// work runs on a stream of its own (the group's p2p stream), never behind the group's collective
// kernels, which may be waiting for a peer that is itself waiting for this message. The sender
// waits (on its thread, as the staged send does) until its caller's stream has reached the send,
// exports the allocation holding its tensor (cudaIpcGetMemHandle) and sends a P2PDesc through
// the CPU engine's point-to-point lane, under a tag of the backend's own derived from the user's
// (exec::kInternalTags: a CPU tensor's message never matches it, nor the reverse). The receiver
// opens the allocation (the cache of registered tensors), copies the bytes into its tensor on the
// p2p stream (after its caller's stream reached the recv), and a host function behind the copy
// sends the sender a P2PReply; the sender's Work completes when that reply arrives, so the
// sender's tensor is read only while its Work is pending (a send is done when its data has been
// received). The receiver's Work completes once the copy is enqueued; its wait() makes the
// caller's stream wait on it. Sizes that disagree raise ValueError on both sides. Where the
// receiver cannot open the allocation (no peer access, no shared IPC namespace) or its copy
// fails, it replies so and both sides raise (naming TILECOMM_CUDA_P2P=staged). Where the sender's
// tensor cannot be exported (expandable segments, pool memory) the bytes follow through pinned
// host memory under a tag of their own, without a reply (a size mismatch then raises on the
// receiver only, as staged). An exported send that times out fails the group and keeps its tensor
// until the group's end (its receiver might still copy it); a receiver that learnt of a peer's
// failure copies nothing. At the group's end the p2p stream is synchronized and the backend's own
// messages still queued (the replies behind the last copies among them) are sent, for up to a
// second, before the point-to-point thread stops. A mapping of a peer's allocation opened here
// stays open until that address is reused by the collectives' registration, or the group ends.
#pragma once

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/process_group.hpp"
#include "common/types.h"
#include "cuda/allreduce.h"
#include "cuda/alltoall.h"
#include "cuda/blocks.h"
#include "cuda/peer_transport.h"
#include "cuda/schedule_executor.h"
#include "exec/p2p.h"

namespace tilecomm::backend {

/// The group's CUDA settings (rank 0's values, like every setting).
struct CudaSettings {
  std::string allreduce = "auto";  // auto | one_shot | two_shot | registered | scheduled | staged | nvshmem_two_shot
  uint64_t ipc_bytes = 4u << 20;   // largest all_reduce run by a direct kernel (per staging buffer)
  uint64_t register_bytes = 4u << 20;  // all_reduce (auto) on registered tensors from this size (0: never)
  uint64_t allgather_register_bytes = 4u << 20;  // all_gather into registered outputs (0: never, or forced)
  uint64_t alltoall_register_bytes = 0;  // equal-block all_to_all into registered outputs (0: never; fifo)
  uint64_t captured_register_bytes = 1u << 20;  // all_reduce (auto) captured in a CUDA graph: the same, from here
  int64_t timeout_ms = 30 * 60 * 1000;   // the group's timeout
  std::string proto = "auto";            // auto | ll | simple
  // Per peer memory (indexed by cuda::PeerMemory, the order of cuda_model.MEMORIES), set by
  // set_cuda from the selector's CUDA model or TILECOMM_LL_BYTES / TILECOMM_CUDA_TWO_SHOT_BYTES:
  uint64_t ll_bytes[cuda::kMemories] = {};                  // auto: LL all_reduce up to this size
  uint64_t two_shot_bytes[cuda::kMemories] = {~0ull, ~0ull, ~0ull};  // auto: two_shot from this size on
  uint64_t allgather_ll_bytes = cuda::kLLMaxBytes;  // auto: LL all_gather up to this size (per rank)
  // auto: an all_gather above this size (per rank) whose output registers runs the push into the
  // registered outputs, even under the LL limit (the CUDA model's crossover)
  uint64_t allgather_register_ll_bytes = cuda::kLLMaxBytes;
  // The schedule executor's decision tables (executor_model.py), per peer memory (cuda_ipc,
  // host_mapped) and collective (Coll): the first entry with nbytes <= max_bytes names the
  // algorithm. A collective without a table keeps the CPU table's choice.
  std::vector<std::vector<std::pair<uint64_t, uint16_t>>> executor_tables[2];
  std::string transport = "auto";        // auto | host_mapped (TILECOMM_TRANSPORT)
  std::string fence = "auto";            // auto | system (TILECOMM_CUDA_FENCE; Note [Fence scope])
  std::string p2p = "direct";            // direct | staged (TILECOMM_CUDA_P2P; Note [Direct point-to-point])
  // How GPUs of the host are joined, from NVML on rank 0: "<bus id> <bus id>" -> nvlink | pcie | none
  // (both orders; bus ids as canonicalBusId of common/pci.h writes them). Missing pairs are "unknown".
  std::map<std::string, std::string> gpu_links;
  // NVSHMEM (blocks.h): the host library's path ("" when not offered: nvshmem_why says why), the
  // bytes of each staging buffer, how push algorithms move data (auto | put_signal), algorithms
  // forced by TILECOMM_ALGO ("" | nvshmem_push | nvshmem_pull), and, unforced, the sizes (bytes
  // per block) from which pull replaces push (from the selector's CUDA model).
  std::string nvshmem_lib;
  std::string nvshmem_why;
  uint64_t nvshmem_bytes = 32u << 20;
  std::string nvshmem_data = "auto";
  std::string allgather;
  std::string reducescatter;
  uint64_t allgather_pull_bytes = ~0ull;
  uint64_t reducescatter_pull_bytes = ~0ull;
};

/// What the group's GPUs found at their first direct call (empty before it).
struct GpuTopology {
  std::string transport;                        // cuda_ipc | host_mapped | staged | unset
  std::vector<std::string> devices;             // PCI bus id of every rank's GPU
  std::vector<std::vector<std::string>> links;  // [r][q]: self | same_gpu | nvlink | pcie | none | unknown
};

/// Reusable CUDA events of one device (timing disabled). An event goes back to the pool with
/// the operation that used it; recording it again later is safe even before the GPU reached its
/// last record, since a stream wait takes the record that precedes it.
class EventPool {
 public:
  explicit EventPool(c10::DeviceIndex device) : device_(device) {}
  ~EventPool();  // destroys the events (errors ignored: at exit the runtime may be gone)
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  cudaEvent_t get();  // a free event, or a new one on the pool's device
  void put(cudaEvent_t e);

 private:
  c10::DeviceIndex device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

struct CudaOp;
struct TensorExport;  // Note [Registered tensors]

/// Note [Stream order]: a group's collectives take device sequence numbers from one counter
/// per rank (Note [Device sequence]), so their kernels must run one after another in issue
/// order. Those that run on one stream do; where a collective's stream differs from the
/// previous one's (an asynchronous call after a synchronous one, or the caller switched
/// streams), its stream first waits on the previous collective's `end` event. The group keeps
/// that collective (and so its events) until the next one. Used inside tasks only, one at a
/// time. Captured collectives are left out: their kernels run when the graph is replayed,
/// ordered within the graph, and the caller orders the replays (as with NCCL).
class StreamOrder {
 public:
  /// Before a collective's GPU work on op.stream.
  void enter(const CudaOp& op);
  /// After it, once op's `end` is recorded.
  void leave(std::shared_ptr<const CudaOp> op);
  /// At the group's end: waits until the GPU has passed the last collective.
  void drain();

 private:
  std::shared_ptr<const CudaOp> last_;  // the last collective run eagerly
};

/// One CUDA operation's stream bookkeeping (Note [CUDA streams]).
struct CudaOp : std::enable_shared_from_this<CudaOp> {
  /// on_caller: runs on the caller's current stream `s` (Note [Synchronous CUDA calls]).
  CudaOp(c10::Device d, c10::cuda::CUDAStream s, std::shared_ptr<EventPool> pool, bool on_caller);
  ~CudaOp();  // returns the events to the pool
  CudaOp(const CudaOp&) = delete;
  CudaOp& operator=(const CudaOp&) = delete;
  c10::Device device;
  c10::cuda::CUDAStream stream;  // the group's internal stream, or the caller's (on_caller_stream)
  bool on_caller_stream;
  std::shared_ptr<EventPool> pool;
  StreamOrder* order = nullptr;  // the group's, for collectives (Note [Stream order]); used in run()
  cudaEvent_t ready = nullptr;   // the caller's current stream at issue (internal stream only)
  cudaEvent_t end;               // the operation's stream after its GPU work
  std::atomic<bool> end_recorded{false};  // set by run()
  uint64_t direct_launch = 0;    // the launch id of its direct kernel, 0 if none
  bool captured = false;         // issued while the caller's stream was capturing a CUDA graph
  uint64_t issued = 0;           // collectives the group issued before this one (Note [Registered tensors])
  std::shared_ptr<cuda::PeerTransport> ipc;

  /// Why its direct kernel failed on the GPU ("" if it did not, or has not finished).
  std::string directError() const;
  /// Whether the GPU has passed `end` (true if run() never recorded it). Not under capture.
  bool endReached() const;
  /// Makes the current stream of the operation's device wait on `end` (no-op if never recorded,
  /// or if the current stream is the one the operation ran on).
  void waitEnd() const;
  /// Runs fn with the device and the operation's stream current (on the internal stream: after it
  /// waited on `ready`, and then marks `tensors` used by it), then records `end` (also when fn
  /// throws).
  void run(const std::vector<at::Tensor>& tensors, const std::function<void()>& fn);
};

/// Note [Direct point-to-point]: what a sender tells its receiver (through the CPU engine).
struct P2PDesc {
  static constexpr uint64_t kMagic = 0x7032706465736331ull;
  uint64_t magic = kMagic;
  uint64_t nbytes = 0;  // of the sender's tensor
  uint64_t seq = 0;     // the sender's message number to this receiver: tags the reply and the bytes
  cudaIpcMemHandle_t handle{};
  uint64_t base = 0, id = 0, offset = 0;  // the allocation (its address and id in the sender) and the tensor in it
  uint8_t exported = 0;  // else the bytes follow through host memory
  uint8_t pad[7] = {};
};

/// The receiver's answer to an exported send, once its copy has ended (or it failed).
struct P2PReply {
  enum Code : int64_t { kCopied = 0, kSizeMismatch = 1, kFailed = 2 };  // kFailed: could not open or copy
  int64_t code = kCopied;
  int64_t posted = 0;  // kSizeMismatch: bytes of the receive
};

/// The tags of the backend's own point-to-point messages (exec::kInternalTags and above): a
/// descriptor under the user's tag, and the reply and the host bytes under the message's number.
int64_t p2pDescTag(int tag);
int64_t p2pReplyTag(uint64_t seq);
int64_t p2pDataTag(uint64_t seq);

class CudaGroup {
 public:
  CudaGroup(int rank, int world, c10::intrusive_ptr<c10d::Store> store, std::string prefix, CudaSettings settings,
            PeerWatch watch);
  ~CudaGroup();

  /// At issue, on the caller's thread: a CUDA operation on `device`, its ready event recorded
  /// on the current stream; with on_caller_stream, it runs on the caller's current stream
  /// instead and records no ready event (Note [Synchronous CUDA calls]). The first call binds
  /// the group to the device.
  std::shared_ptr<CudaOp> begin(const c10::Device& device, bool on_caller_stream = false);
  /// The same for a collective, ordered with the group's others (Note [Stream order]).
  std::shared_ptr<CudaOp> beginCollective(const c10::Device& device, bool on_caller_stream);

  /// Whether an all_reduce may run as a direct kernel, decided from the call alone (the same on
  /// every rank); which kernel is chosen in the task, once the peer memory is known (allReduceDirect).
  bool directEligible(uint64_t nbytes, DType dtype, RedOp op) const;
  /// Whether an all_gather of nbytes per rank runs as the LL kernel (decided from the call alone).
  bool allGatherLL(uint64_t nbytes) const;
  /// At issue: the NVSHMEM algorithm an all_gather of nbytes per rank runs, if any (decided from the
  /// call alone; unforced, only above the LL limit, and only where the library was found).
  std::optional<cuda::BlockAlgo> allGatherBlocks(uint64_t nbytes) const;
  /// At issue: the NVSHMEM algorithm a reduce_scatter of nbytes per rank runs, if any.
  std::optional<cuda::BlockAlgo> reduceScatterBlocks(uint64_t nbytes, DType dtype, RedOp op) const;
  /// At issue: the NVSHMEM algorithm an all_reduce runs, if any: only where
  /// TILECOMM_CUDA_ALLREDUCE=nvshmem_two_shot forces it.
  std::optional<cuda::BlockAlgo> allReduceBlocks(uint64_t nbytes, DType dtype, RedOp op) const;
  /// In a task: the NVSHMEM algorithm to run for `algo` (the same answer on every rank), or nullopt
  /// (the call takes the schedule executor or is staged) where the NVSHMEM transport is not up or,
  /// unforced, under CUDA graph capture where it cannot be held (Note [NVSHMEM capture]: the set-up,
  /// put-with-signal); the first call sets it up with
  /// every rank (Note [NVSHMEM lifetime] in cuda/nvshmem.h). Unforced pull becomes push where the
  /// group moves data with put-with-signal; a forced algorithm (TILECOMM_ALGO, or
  /// TILECOMM_CUDA_ALLREDUCE=nvshmem_two_shot) that cannot run throws Error(kInvalid) saying why.
  std::optional<cuda::BlockAlgo> nvshmemReady(const CudaOp& op, cuda::BlockAlgo algo);
  /// In a task, inside CudaOp::run, after nvshmemReady: enqueues `call` as `algo`.
  void blocksDirect(CudaOp& op, cuda::BlockAlgo algo, const cuda::BlockCall& call, int64_t timeout_ms);
  /// In a task on every rank (collective): bytes of the symmetric heap on `device` (set up on the first
  /// call). Throws Error(kInvalid) where NVSHMEM is not available.
  void* symmetricAlloc(uint64_t nbytes, const c10::Device& device);
  /// The kernel of the last CUDA operation, by its algorithm id ("" before the first and after a
  /// staged one), for benchmarks.
  std::string lastKernel() const;
  /// In a task: whether the peer transport is up. The first call sets it up with every rank
  /// (devices and handles through the Store): cuda_ipc where every pair of GPUs has peer access
  /// and every rank opened every peer, else host_mapped (TILECOMM_TRANSPORT=host_mapped forces
  /// it), else the calls stay staged. Under CUDA graph capture it cannot be set up or fall
  /// back: throws Error(kInvalid) instead.
  bool directReady(const CudaOp& op);
  /// In a task, inside CudaOp::run, after directReady: enqueues a direct all_reduce of t on the
  /// operation's stream, with the kernel the settings pick for its size and the group's peer memory.
  void allReduceDirect(CudaOp& op, at::Tensor& t, DType dtype, RedOp rop, int64_t timeout_ms);
  /// At issue: whether an all_gather of nbytes per rank tries registered outputs (Note [Registered
  /// tensors]; decided from the call alone): from TILECOMM_CUDA_REGISTER_BYTES of output, above the
  /// LL limit, unless TILECOMM_ALGO forces an all_gather algorithm; with TILECOMM_PROTO=auto, an
  /// output that is one range on every rank (`one_range`: all_gather_into_tensor) also under the LL
  /// limit, above the CUDA model's crossover (allgather_register_ll_bytes).
  bool allGatherRegisterEligible(uint64_t nbytes, bool one_range) const;
  /// In a task, inside CudaOp::run: the push all_gather of `in` into every rank's output in place,
  /// over cuda_ipc, where every rank's output (outs[q]: its blocks) is one range that could be
  /// registered; false (on every rank) where not: another path runs.
  bool allGatherRegistered(CudaOp& op, const at::Tensor& in, const std::vector<void*>& outs, int64_t timeout_ms);
  /// In a task, inside CudaOp::run: enqueues an LL all_gather of `in` into outs[q] (one per rank).
  void allGatherDirect(CudaOp& op, const at::Tensor& in, const std::vector<void*>& outs, int64_t timeout_ms);
  /// At issue: whether an all_to_all may run on the GPU (a peer transport is possible; the same on
  /// every rank).
  bool allToAllEligible() const { return settings_.ipc_bytes > 0 && world_ <= cuda::kMaxRanks; }
  /// In a task, inside CudaOp::run: enqueues an all_to_all of the blocks of `call`: with `equal`
  /// blocks (one output, out[q] = out[0] + q x out_bytes[0]) from TILECOMM_CUDA_REGISTER_BYTES of
  /// output over cuda_ipc and TILECOMM_CUDA_ALLTOALL=registered, the push into registered outputs
  /// (cuda/blocks.h); else the FIFO kernel
  /// (cuda/alltoall.h). False (on every rank) where the peer transport is off or the FIFO kernel
  /// does not fit it: the call is staged. Under CUDA graph capture that throws Error(kInvalid).
  bool allToAll(CudaOp& op, const cuda::AllToAllCall& call, bool equal, DType dtype, int64_t timeout_ms);
  /// Note [Direct point-to-point]: whether send and recv of CUDA tensors go GPU to GPU (decided
  /// from the settings alone: the same on every rank).
  bool p2pDirect() const { return p2p_direct_; }
  /// At issue, on the caller's thread: a point-to-point operation on `device`, on the group's p2p
  /// stream, its ready event recorded on the caller's current stream.
  std::shared_ptr<CudaOp> beginP2P(const c10::Device& device);
  /// At issue, on the caller's thread: the descriptor of a send of t to rank dst, once the caller's
  /// stream has reached op (blocks until then); `exported` is 0 where t cannot be exported.
  P2PDesc p2pExport(const CudaOp& op, const at::Tensor& t, int dst);
  /// On the point-to-point thread, for a receive into t matched by rank src's exported descriptor d
  /// (sizes equal): enqueues, inside op.run, the copy from src's tensor into t and behind it a host
  /// function that sends src the reply (kCopied). Throws Error(kSystem) where src's allocation
  /// cannot be opened here (the caller replies kFailed).
  void p2pCopy(CudaOp& op, const at::Tensor& t, int src, const P2PDesc& d, int64_t timeout_ms);
  /// Keeps t until the group's end (a timed-out send's tensor, which its receiver may still read).
  void p2pKeep(const at::Tensor& t);
  /// Sends rank dst the reply to its message seq (on any thread).
  void p2pReply(int dst, uint64_t seq, P2PReply reply, int64_t timeout_ms);
  /// At the group's end: waits until the p2p stream is idle (its replies posted); errors ignored.
  void p2pDrain();
  /// The group's engine, whose scheduled algorithms the schedule executor runs (set once, before
  /// the first call).
  void setEngine(std::shared_ptr<exec::Engine> engine) { engine_ = std::move(engine); }
  /// At issue: whether a collective's body may run its schedule on the GPU (Note [Schedule
  /// executor] in cuda/schedule_executor.h), decided from the call alone (the same on every rank):
  /// a peer transport is possible, and the executor moves (op kNone) or reduces dtype with op.
  /// all_reduce only where TILECOMM_CUDA_ALLREDUCE is not staged or nvshmem_two_shot.
  bool scheduleEligible(Coll coll, DType dtype, RedOp op) const;
  /// In a task, inside CudaOp::run, after directReady: enqueues the schedule of executorPick(call)
  /// (where it has no schedule the executor can walk, the collective's first algorithm that has
  /// one) over call.buf, device memory (rooted: for call.root). Its desc_count is what must agree
  /// across ranks (CollDesc::count): peers check it.
  void runSchedule(CudaOp& op, const exec::CollCall& call);
  /// The algorithm the executor's decision table for the transport's memory picks for call's
  /// buffer (CudaSettings::executor_tables, the same on every rank); call.algo, the CPU table's
  /// choice, where there is no such table (a forced algorithm is in both).
  uint16_t executorPick(const exec::CollCall& call) const;
  /// In a task, inside CudaOp::run: body over pinned host copies of the tensors (reads are
  /// copied in first; writes are copied back once body returned).
  void runStaged(const std::vector<at::Tensor>& reads, const std::vector<at::Tensor>& writes,
                 const std::function<void(const Host&)>& body);

  /// A failed direct kernel's message ("" if none failed).
  std::string failure() const;
  /// "device=cuda:0 direct=on|off|unset (why) ..." for tests and debugging.
  std::string status() const;
  GpuTopology topology() const;

 private:
  bool setUpIpc();
  /// One attempt to set up NVSHMEM and its transport with every rank; false (nvs_why_ says why) if
  /// any rank failed.
  bool setUpNvshmem();
  bool setUpNvshmemOnce();  // setUpNvshmem's steps (they may throw)
  /// Binds the group to `device` (its internal and p2p streams) unless it is bound already.
  void bind(const c10::Device& device);
  std::shared_ptr<CudaOp> begin(const c10::Device& device, bool on_caller_stream, c10::cuda::CUDAStream internal);
  void startWatchdog();
  /// At destruction: waits for the internal stream and for the peers to stop reading our area.
  void releasePeers();
  /// One attempt of setUpIpc with areas of kind m; false (and ipc_why_ extended) if any rank failed.
  bool tryMemory(cuda::PeerMemory m);
  /// Every rank's value under `key` (this rank's is `mine`), exchanged through the Store: a
  /// collective step, each rank in the same task.
  std::vector<std::string> everyRank(const std::string& key, const std::string& mine);
  /// "" where every rank's `why` under `key` is empty, else "rank r: <why>" of the first that is not.
  std::string firstFailure(const std::string& key, const std::string& why);
  /// The smallest of every rank's `mine` under `key`.
  int leastOf(const std::string& key, int mine);
  /// Every rank's GPU as its PCI bus id ("" if unknown), exchanged once per group by the first set-up
  /// that asks (cuda_ipc's or NVSHMEM's; each in a task, so the same one on every rank).
  const std::vector<std::string>& busIds();
  void watchLoop();
  /// LL capacity of the transport: the largest message the LL kernels may carry (0: no LL).
  uint64_t llLimit() const;
  /// The kernel of an all_reduce of nbytes over the group's peer memory (transport up).
  cuda::DirectAlgo allReduceAlgo(uint64_t nbytes) const;
  /// Note [Registered tensors]: whether an all_reduce of nbytes (captured in a CUDA graph or not)
  /// registers its tensors (the same on every rank where every rank captures the call or none does),
  /// and the registered kernel, if every rank could export and open (else false: the staged kernel
  /// runs).
  bool registerEligible(uint64_t nbytes, bool captured) const;
  bool allReduceRegistered(CudaOp& op, at::Tensor& t, DType dtype, RedOp rop, int64_t timeout_ms);
  /// Every rank's address of its tensor of `extent` bytes at p (this rank's own at its index), or
  /// nullopt on every rank where some rank's cannot be exported (not within one exportable
  /// allocation; exportable false: this rank's cannot) or some rank could not open a peer's.
  /// Throws Error(kDesync) on every rank where the ranks' extents differ (a collective mismatch).
  std::optional<std::vector<char*>> registerTensors(CudaOp& op, void* p, uint64_t extent, bool exportable,
                                                    int64_t timeout_ms);
  /// Rank q's allocation (its address `base` and id in q, its handle), opened here (cached);
  /// throws Error(kSystem) where it cannot be. A new id at a known address means the old
  /// allocation was freed: `retire` keeps its mapping open until the group's end, else it is closed
  /// once `stream`, the internal stream and the p2p stream are idle.
  char* peerAllocation(cudaStream_t stream, int q, uint64_t base, uint64_t id, const cudaIpcMemHandle_t& handle,
                       bool retire);
  /// Every rank's `each` bytes at all + rank * each to all of them (the CPU engine's all_gather).
  void exchange(void* all, uint64_t each, int64_t timeout_ms);
  /// After the peer transport is up: every rank's programs of the algorithms that every rank's
  /// executor can walk (agreed through the Store), in device memory.
  void setUpPrograms();

  int rank_;
  int world_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  CudaSettings settings_;
  bool p2p_direct_;  // p2pDirect(), from the settings

  std::mutex mu_;  // binding to a device
  std::optional<c10::Device> device_;
  cudaStream_t raw_stream_ = nullptr;
  std::optional<c10::cuda::CUDAStream> stream_;
  std::optional<c10::cuda::CUDAStream> p2p_stream_;  // Note [Direct point-to-point]
  std::shared_ptr<EventPool> events_;  // of the bound device
  StreamOrder order_;  // only touched inside tasks

  enum class Ipc { kUnset, kOn, kOff };
  Ipc ipc_state_ = Ipc::kUnset;  // only touched inside tasks (one at a time)
  std::string ipc_why_;
  std::shared_ptr<cuda::PeerTransport> ipc_;
  std::vector<std::string> bus_ids_;  // busIds(); only touched inside tasks
  GpuTopology topo_;
  mutable std::mutex topo_mu_;
  std::atomic<int> last_kernel_{-1};  // DirectAlgo, kLastAllGatherLL, or kLastBlocks + BlockAlgo
  Ipc nvs_state_ = Ipc::kUnset;       // only touched inside tasks
  std::string nvs_why_;
  bool nvs_direct_ = false;  // kernel stores (every rank has every peer address), else put-with-signal
  std::shared_ptr<cuda::PeerTransport> nvs_;  // assigned under watch_mu_ (the watchdog reads it)
  std::atomic<uint64_t> in_place_calls_{0};   // NVSHMEM calls whose input peers read, or whose output they write, in place
  // Note [Registered tensors] (under mapped_mu_: tasks and the point-to-point thread use it): the
  // peers' allocations opened here, by (rank, base in its process) -> {the allocation's id there,
  // address here}, and the mappings of freed ones that point-to-point retired; (only touched
  // inside tasks) the ids of this rank's allocations that every peer has opened.
  std::mutex mapped_mu_;
  std::map<std::pair<int, uint64_t>, std::pair<uint64_t, char*>> mapped_;
  std::vector<char*> retired_;
  std::set<uint64_t> known_;
  std::mutex p2p_mu_;
  std::vector<uint64_t> p2p_sent_;  // messages sent to each rank (Note [Direct point-to-point])
  std::atomic<uint64_t> p2p_exported_{0};  // sends whose tensor was exported
  std::atomic<uint64_t> p2p_copies_{0};    // receives copied from a peer's tensor
  std::vector<at::Tensor> p2p_kept_;  // under p2p_mu_ (p2pKeep)
  std::atomic<uint64_t> registered_calls_{0};

  std::shared_ptr<exec::Engine> engine_;
  // The executor's programs, by (algorithm id, root; -1 when not rooted); set up with the transport.
  std::map<std::pair<uint16_t, int>, cuda::DeviceProgram> programs_;
  std::map<int, uint16_t> first_program_;  // Coll -> its first algorithm with programs

  PeerWatch watch_;  // Note [GPU watchdog]
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  std::thread watcher_;
};

/// Point-to-point staging: a pinned tensor of t's shape and dtype; a pinned copy of t once the
/// caller's stream reached issue (blocks until copied); and the copy back of a received message
/// (enqueued on op's stream).
at::Tensor pinnedLike(const at::Tensor& t);
at::Tensor copyToHost(CudaOp& op, const at::Tensor& t);
void copyFromHost(CudaOp& op, const at::Tensor& t, const at::Tensor& host);

/// A point-to-point operation of the backend's own (Note [Direct point-to-point]).
exec::P2POp p2pMessage(bool send, int peer, int64_t tag, void* ptr, size_t nbytes, int64_t timeout_ms,
                       std::string label, std::function<void(int, const std::string&)> done);

}  // namespace tilecomm::backend

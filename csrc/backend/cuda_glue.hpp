// CUDA tensors in the c10d glue (built only when torch has CUDA).
//
// Note [CUDA streams]: NCCL's contract. At issue, on the caller's thread, an
// operation records a `ready` event on the caller's current stream. When its
// turn comes (Note [Issue order]), its GPU work goes to the group's internal
// stream, which first waits on `ready`: either a direct kernel over the peer
// transport (cuda_ipc or host_mapped; all_reduce, LL all_gather up to the LL
// buffer) or over the NVSHMEM transport (all_gather, reduce_scatter: blocks.h),
// or the staged path: copies to pinned host memory, the CPU engine's
// collective over them, copies back.
// Then an `end` event is recorded on the internal stream and the tensors are
// marked used by it (recordStream), so the caching allocator never hands their
// memory out before the stream is done with them. work.wait() makes the
// caller's current stream wait on `end` and does not block the CPU on GPU
// work (only on the host part of a staged operation, which has to run first);
// the Work's Future is device-aware and its events are recorded on the
// internal stream. Operations run in issue order on one stream, so several in
// flight on a group are ordered the same way on every rank.
//
// Note [CUDA graphs]: an operation issued while the caller's stream is being
// captured is captured too: `ready` forks the internal stream into the capture,
// `end` joins it back when the caller waits (wait() never queries a captured
// event). Only direct kernels can be captured (they take no per-call value from
// the host, Note [Device sequence]); a staged operation under capture raises a
// ValueError at the call, and so does the group's first direct call (it sets up
// the transport through the Store and cudaMalloc): run one before capturing.
#pragma once

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/process_group.hpp"
#include "common/types.h"
#include "cuda/allreduce.h"
#include "cuda/blocks.h"
#include "cuda/peer_transport.h"

namespace tilecomm::backend {

/// The group's CUDA settings (rank 0's values, like every setting).
struct CudaSettings {
  std::string allreduce = "auto";  // auto | one_shot | two_shot | staged | nvshmem_two_shot
  uint64_t ipc_bytes = 4u << 20;   // largest all_reduce run by a direct kernel (per staging buffer)
  int64_t timeout_ms = 30 * 60 * 1000;   // the group's timeout
  std::string proto = "auto";            // auto | ll | simple
  // Per peer memory (indexed by cuda::PeerMemory, the order of cuda_model.MEMORIES), set by
  // set_cuda from the selector's CUDA model or TILECOMM_LL_BYTES / TILECOMM_CUDA_TWO_SHOT_BYTES:
  uint64_t ll_bytes[cuda::kMemories] = {};                  // auto: LL up to this size
  uint64_t two_shot_bytes[cuda::kMemories] = {~0ull, ~0ull, ~0ull};  // auto: two_shot from this size on
  std::string transport = "auto";        // auto | host_mapped (TILECOMM_TRANSPORT)
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

/// One CUDA operation's stream bookkeeping (Note [CUDA streams]).
struct CudaOp {
  CudaOp(c10::Device d, c10::cuda::CUDAStream s) : device(d), stream(s) {}
  c10::Device device;
  c10::cuda::CUDAStream stream;  // the group's internal stream
  at::cuda::CUDAEvent ready;     // the caller's current stream at issue
  at::cuda::CUDAEvent end;       // the internal stream after the operation's GPU work
  uint64_t direct_launch = 0;    // the launch id of its direct kernel, 0 if none
  bool captured = false;         // issued while the caller's stream was capturing a CUDA graph
  std::shared_ptr<cuda::PeerTransport> ipc;

  /// Why its direct kernel failed on the GPU ("" if it did not, or has not finished).
  std::string directError() const;
  /// Runs fn with the device and the internal stream current, after the stream waited on
  /// `ready`; then marks `tensors` used by the stream and records `end` (also when fn throws).
  void run(const std::vector<at::Tensor>& tensors, const std::function<void()>& fn);
};

class CudaGroup {
 public:
  CudaGroup(int rank, int world, c10::intrusive_ptr<c10d::Store> store, std::string prefix, CudaSettings settings,
            PeerWatch watch);
  ~CudaGroup();

  /// At issue, on the caller's thread: a CUDA operation on `device`, its ready event recorded
  /// on the current stream. The first call binds the group to the device.
  std::shared_ptr<CudaOp> begin(const c10::Device& device);

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
  /// (the call is staged) where the NVSHMEM transport is not up; the first call sets it up with
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
  /// internal stream, with the kernel the settings pick for its size and the group's peer memory.
  void allReduceDirect(CudaOp& op, at::Tensor& t, DType dtype, RedOp rop, int64_t timeout_ms);
  /// In a task, inside CudaOp::run: enqueues an LL all_gather of `in` into outs[q] (one per rank).
  void allGatherDirect(CudaOp& op, const at::Tensor& in, const std::vector<void*>& outs, int64_t timeout_ms);
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
  /// Binds the group to `device` (its internal stream) unless it is bound already.
  void bind(const c10::Device& device);
  void startWatchdog();
  /// At destruction: waits for the internal stream and for the peers to stop reading our area.
  void releasePeers();
  /// One attempt of setUpIpc with areas of kind m; false (and ipc_why_ extended) if any rank failed.
  bool tryMemory(cuda::PeerMemory m);
  void watchLoop();
  /// LL capacity of the transport: the largest message the LL kernels may carry (0: no LL).
  uint64_t llLimit() const;
  /// The kernel of an all_reduce of nbytes over the group's peer memory (transport up).
  cuda::DirectAlgo allReduceAlgo(uint64_t nbytes) const;

  int rank_;
  int world_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  CudaSettings settings_;

  std::mutex mu_;  // binding to a device
  std::optional<c10::Device> device_;
  cudaStream_t raw_stream_ = nullptr;
  std::optional<c10::cuda::CUDAStream> stream_;

  enum class Ipc { kUnset, kOn, kOff };
  Ipc ipc_state_ = Ipc::kUnset;  // only touched inside tasks (one at a time)
  std::string ipc_why_;
  std::shared_ptr<cuda::PeerTransport> ipc_;
  GpuTopology topo_;
  mutable std::mutex topo_mu_;
  std::atomic<int> last_kernel_{-1};  // DirectAlgo, kLastAllGatherLL, or kLastBlocks + BlockAlgo
  Ipc nvs_state_ = Ipc::kUnset;       // only touched inside tasks
  std::string nvs_why_;
  bool nvs_direct_ = false;  // kernel stores (every rank has every peer address), else put-with-signal
  std::shared_ptr<cuda::PeerTransport> nvs_;  // assigned under watch_mu_ (the watchdog reads it)
  std::atomic<uint64_t> in_place_calls_{0};   // NVSHMEM calls whose input peers read, or whose output they write, in place

  PeerWatch watch_;  // Note [GPU watchdog]
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  std::thread watcher_;
};

/// Point-to-point staging: a pinned copy of t once the caller's stream reached issue (blocks
/// until copied), and the copy back of a received message (enqueued on the internal stream).
at::Tensor copyToHost(CudaOp& op, const at::Tensor& t);
void copyFromHost(CudaOp& op, const at::Tensor& t, const at::Tensor& host);

}  // namespace tilecomm::backend

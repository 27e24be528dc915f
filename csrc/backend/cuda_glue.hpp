// CUDA tensors in the c10d glue (built only when torch has CUDA).
//
// Note [CUDA streams]: NCCL's contract. At issue, on the caller's thread, an
// operation records a `ready` event on the caller's current stream. When its
// turn comes (Note [Issue order]), its GPU work goes to the group's internal
// stream, which first waits on `ready`: either a direct kernel over cuda_ipc
// (all_reduce up to TILECOMM_CUDA_IPC_BYTES, LL all_gather up to the LL
// buffer), or the staged path: copies to pinned host memory, the CPU engine's
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

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backend/process_group.hpp"
#include "common/types.h"
#include "cuda/allreduce.h"
#include "cuda/cuda_ipc.h"

namespace tilecomm::backend {

/// The group's CUDA settings (rank 0's values, like every setting).
struct CudaSettings {
  std::string allreduce = "auto";  // auto | one_shot | two_shot | staged
  uint64_t ipc_bytes = 4u << 20;   // largest all_reduce run by a direct kernel (per staging buffer)
  uint64_t two_shot_bytes = 256u << 10;  // auto: two_shot from this size on
  int64_t timeout_ms = 30 * 60 * 1000;   // the group's timeout
  std::string proto = "auto";            // auto | ll | simple
  uint64_t ll_bytes = 512u << 10;        // auto: LL up to this size (measured crossover)
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
  std::shared_ptr<cuda::IpcTransport> ipc;

  /// Why its direct kernel failed on the GPU ("" if it did not, or has not finished).
  std::string directError() const;
  /// Runs fn with the device and the internal stream current, after the stream waited on
  /// `ready`; then marks `tensors` used by the stream and records `end` (also when fn throws).
  void run(const std::vector<at::Tensor>& tensors, const std::function<void()>& fn);
};

class CudaGroup {
 public:
  CudaGroup(int rank, int world, c10::intrusive_ptr<c10d::Store> store, std::string prefix, CudaSettings settings);
  ~CudaGroup();

  /// At issue, on the caller's thread: a CUDA operation on `device`, its ready event recorded
  /// on the current stream. The first call binds the group to the device.
  std::shared_ptr<CudaOp> begin(const c10::Device& device);

  /// The direct kernel an all_reduce would use, decided from the call alone (the same on every rank).
  std::optional<cuda::DirectAlgo> directFor(uint64_t nbytes, DType dtype, RedOp op) const;
  /// Whether an all_gather of nbytes per rank runs as the LL kernel (decided from the call alone).
  bool allGatherLL(uint64_t nbytes) const;
  /// In a task: whether the cuda_ipc transport is up. The first call sets it up with every rank
  /// (handles through the Store); it is used only if every rank opened every peer. Under CUDA
  /// graph capture it cannot be set up or fall back: throws Error(kInvalid) instead.
  bool directReady(const CudaOp& op);
  /// In a task, inside CudaOp::run: enqueues a direct all_reduce of t on the internal stream.
  void allReduceDirect(CudaOp& op, cuda::DirectAlgo algo, at::Tensor& t, DType dtype, RedOp rop, int64_t timeout_ms);
  /// In a task, inside CudaOp::run: enqueues an LL all_gather of `in` into outs[q] (one per rank).
  void allGatherDirect(CudaOp& op, const at::Tensor& in, const std::vector<at::Tensor>& outs, int64_t timeout_ms);
  /// In a task, inside CudaOp::run: body over pinned host copies of the tensors (reads are
  /// copied in first; writes are copied back once body returned).
  void runStaged(const std::vector<at::Tensor>& reads, const std::vector<at::Tensor>& writes,
                 const std::function<void(const Host&)>& body);

  /// A failed direct kernel's message ("" if none failed).
  std::string failure() const;
  /// "device=cuda:0 direct=on|off|unset (why) ..." for tests and debugging.
  std::string status() const;

 private:
  bool setUpIpc();
  /// LL capacity of the transport: the largest message the LL kernels may carry (0: no LL).
  uint64_t llLimit() const;

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
  std::shared_ptr<cuda::IpcTransport> ipc_;
};

/// Point-to-point staging: a pinned copy of t once the caller's stream reached issue (blocks
/// until copied), and the copy back of a received message (enqueued on the internal stream).
at::Tensor copyToHost(CudaOp& op, const at::Tensor& t);
void copyFromHost(CudaOp& op, const at::Tensor& t, const at::Tensor& host);

}  // namespace tilecomm::backend

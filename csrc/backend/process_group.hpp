// The c10d glue: a torch.distributed Backend whose operations validate their
// inputs, prepare the buffer a schedule runs over, and hand the call to the
// engine. No algorithm logic lives here.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "exec/engine.h"

namespace tilecomm::backend {

/// The engine's name for a torch dtype; nullopt for dtypes it can only move as bytes.
std::optional<DType> toDType(at::ScalarType t);

// CUDA tensors (cuda_glue.hpp, built only when torch has CUDA; Note [CUDA streams]).
struct CudaOp;
class CudaGroup;
struct GpuTopology;
/// Note [GPU watchdog] (cuda/peer_transport.h): the ranks of the group whose processes have
/// exited, each with how ("rank 2 (pid 935) exited"). Called from the CUDA group's watchdog thread.
using PeerWatch = std::function<std::vector<std::pair<int, std::string>>()>;

/// Maps a call's tensors to the ones its body works on: the tensors themselves
/// (CPU, and CUDA tensors whose schedule runs on the GPU: cudaOp() is then the
/// operation), or pinned host copies (CUDA tensors on the staged path).
class Host {
 public:
  explicit Host(CudaOp* op = nullptr) : op_(op) {}
  CudaOp* cudaOp() const { return op_; }
  at::Tensor operator()(const at::Tensor& t) const {
    for (const auto& [impl, h] : twins_)
      if (impl == t.unsafeGetTensorImpl()) return h;
    return t;
  }
  bool has(const at::Tensor& t) const {
    for (const auto& tw : twins_)
      if (tw.first == t.unsafeGetTensorImpl()) return true;
    return false;
  }
  void add(const at::Tensor& t, at::Tensor host) { twins_.emplace_back(t.unsafeGetTensorImpl(), std::move(host)); }

 private:
  std::vector<std::pair<c10::TensorImpl*, at::Tensor>> twins_;
  CudaOp* op_;
};

class TilecommWork : public c10d::Work {
 public:
  TilecommWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
               std::shared_ptr<CudaOp> cuda = nullptr);
  /// CUDA: also the GPU work is done.
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  /// Blocks until the host part is done; CUDA: then the current stream waits on the GPU work
  /// (the CPU does not), and a direct kernel that already failed raises.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  /// CUDA: the current stream waits on the operation's end event.
  void synchronize() override;
  int sourceRank() const override { return source_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  /// Made on the first call (most callers never ask): a plain synchronous collective makes no
  /// Future, and so no Future events for CUDA work.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  /// Marks the work done (successfully when eptr is null) and completes its future.
  void complete(std::exception_ptr eptr, int source = -1);

 private:
  void completeFuture(c10::ivalue::Future& future);  // once both the Future and the outcome exist

  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;  // inputs and scratch buffers alive until done
  std::shared_ptr<CudaOp> cuda_;  // null for CPU work
  std::mutex future_mu_;          // future_, finished_
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool finished_ = false;
  std::exception_ptr result_;  // the outcome, set before finished_
  int source_ = -1;
};

class ProcessGroupTilecomm : public c10d::Backend {
 public:
  /// `store`: the Store the group was set up through (Note [Splitting]: its children set up there).
  ProcessGroupTilecomm(std::shared_ptr<exec::Engine> engine, int64_t timeout_ms, c10::intrusive_ptr<c10d::Store> store);
  /// Stops the point-to-point thread first: its callbacks use the group's CUDA side, which goes next.
  ~ProcessGroupTilecomm() override;

  const std::string getBackendName() const override { return "tilecomm"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  /// c10d's sequence number (ProcessGroupWrapper, under TORCH_DISTRIBUTED_DEBUG=DETAIL, checks it
  /// across ranks before each collective): the collectives this rank has issued, from 0 at creation
  /// on every rank, so there is nothing to agree on; point-to-point calls are not counted.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return issued_.load(std::memory_order_relaxed); }

  // Note [Splitting]: dist.split_group (and DeviceMesh, when the default group was made with a
  // device_id) makes a child group of some of this group's ranks through split(). The child is a new
  // tilecomm group of those ranks, set up by the Python side as new_group would set it up (the split
  // hook, which module.cpp installs), through this group's own set-up Store under a prefix naming the
  // child's ranks: `tilecomm-split[0,2]`. Two children of the same ranks take successive generations
  // there (the creation counter of tilecomm._backend.create).
  // The Store that c10d hands over is not used for this: c10d names it after the child, and the
  // members of one child may be given different names. torch's dist.split_group hashes the ranks
  // with the count of groups this process has registered, and a new_group registers only on its
  // members, so after new_group([0, 1]) ranks 0 and 2 of a world of 4 name the child [0, 2] apart.
  // NCCL splits its communicator and needs no Store; a set-up through c10d's would hang.
  // Ranks outside `ranks` get no backend and take no part; nothing of this group is shared.
  // c10d calls split once per device type the backend serves (CPU and CUDA here) with the same
  // Store: the second call returns the child the first made.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  /// Makes a tilecomm group: (store, rank in it, its size, timeout in ms, group name) -> the backend.
  using SplitHook = std::function<c10::intrusive_ptr<c10d::Backend>(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                                     int64_t, const std::string&)>;
  static void setSplitHook(SplitHook hook);

  exec::Engine& engine() { return *engine_; }
  const c10::intrusive_ptr<c10d::Store>& setupStore() const { return store_; }
  /// Enables CUDA tensors (CUDA builds): the Store and key prefix of the group's set-up, and its settings.
  void setCuda(std::shared_ptr<CudaGroup> cuda);
  /// The CUDA side's state, for tests and debugging ("" before setCuda).
  std::string cudaStatus() const;
#ifdef TILECOMM_WITH_CUDA
  GpuTopology cudaTopology() const;
  std::string cudaLastKernel() const;
  /// Note [GPU watchdog]: the peers of this host whose processes have exited.
  PeerWatch peerWatch() const;
  /// Collective (every rank, in issue order with the group's operations): an uninitialised tensor
  /// on NVSHMEM's symmetric heap of `device` (Note [NVSHMEM lifetime] in cuda/nvshmem.h).
  at::Tensor symmetricEmpty(const std::vector<int64_t>& sizes, at::ScalarType dtype, const c10::Device& device);
#endif

 private:
  /// The body of a call; h maps its tensors to the ones to work on (see Host).
  using Body = std::function<void(const Host& h)>;
  /// A CUDA call's alternative to staging: runs it on the GPU and returns true, or returns
  /// false to have it staged. Runs in the task with the operation's stream current.
  using Direct = std::function<bool(CudaOp& op)>;
  /// The one generic path of every collective (c10d's collective() habit). `outputs` are the
  /// Work's result; `reads` and `writes` are the tensors the body reads and writes (all on one
  /// device; CUDA ones are staged, Note [CUDA streams]).
  /// on_device: the body may run on CUDA tensors themselves, its schedule on the GPU (Note
  /// [Schedule executor] in cuda/schedule_executor.h) where the peer transport is up; decided at
  /// issue from the call alone (onDevice).
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, bool async, std::vector<at::Tensor> outputs,
                                        std::vector<at::Tensor> reads, std::vector<at::Tensor> writes, Body body,
                                        Direct direct = nullptr, bool on_device = false);
  /// Whether a collective over CUDA tensor t may run its schedule on the GPU (op kNone: data movement).
  bool onDevice(Coll coll, const at::Tensor& t, RedOp op) const;
  /// all_reduce of a CUDA tensor by a direct kernel, when the call qualifies (else null).
  Direct directAllReduce(const at::Tensor& t, DType dtype, const c10d::ReduceOp& op, int64_t timeout_ms);
  /// all_gather of a CUDA tensor by a direct kernel (NVSHMEM, or LL) into outs (one per rank), when it
  /// qualifies (else null).
  Direct directAllGather(const at::Tensor& in, std::vector<void*> outs, bool one_range, int64_t timeout_ms);
  /// reduce_scatter of CUDA tensors into out by an NVSHMEM kernel, when it qualifies (else null): ins
  /// holds one tensor per rank, or (contiguous) one tensor of every rank's block.
  Direct directReduceScatter(std::vector<at::Tensor> ins, bool contiguous, const at::Tensor& out, DType dtype,
                             const c10d::ReduceOp& op, int64_t timeout_ms);
  /// all_to_all of CUDA tensors by the all_to_all kernel, where the peer transport runs it (else
  /// staged); null for CPU tensors. Block q (to rank q) lies at in_off[q] (in_len[q] bytes) in ins[0],
  /// or in ins[q] where ins has a tensor per block; the output's blocks (from rank q) likewise.
  /// equal: every block of one size, back to back in one output (TILECOMM_CUDA_ALLTOALL=registered).
  Direct directAllToAll(std::vector<at::Tensor> ins, std::vector<size_t> in_off, std::vector<size_t> in_len,
                        std::vector<at::Tensor> outs, std::vector<size_t> out_off, std::vector<size_t> out_len,
                        bool equal, DType dtype, int64_t timeout_ms);
  /// all_reduce (SUM) of a sparse COO CPU tensor, as Gloo does it: every rank's indices and values
  /// gathered, summed by coalescing, copied into t (Note [Sparse all_reduce]).
  c10::intrusive_ptr<c10d::Work> allreduceSparse(at::Tensor& t, const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> pointToPoint(c10d::OpType type, at::Tensor& t, int peer, int tag);
  /// Send and recv of CUDA tensors GPU to GPU (Note [Direct point-to-point] in cuda_glue.hpp).
  c10::intrusive_ptr<c10d::Work> sendDirect(const at::Tensor& t, int dst, int tag, std::shared_ptr<CudaOp> cop);
  c10::intrusive_ptr<c10d::Work> recvDirect(c10d::OpType type, const at::Tensor& t, int src, int tag,
                                            std::shared_ptr<CudaOp> cop);
  /// Runs an in-place reducing schedule over t (all_reduce, reduce, reduce_scatter): on the CPU
  /// engine, or, for a CUDA tensor (h.cudaOp() set), on the GPU's schedule executor.
  void reduceOver(const Host& h, Coll coll, at::Tensor& t, const c10d::ReduceOp& op, int root, uint64_t desc_count,
                  int64_t timeout_ms);
  /// The same for a data-moving schedule (broadcast, all_gather, gather, scatter).
  void move(const Host& h, Coll coll, at::Tensor& t, int root, uint64_t desc_count, int64_t timeout_ms);
  /// call on the CPU engine, or on the GPU's schedule executor where h.cudaOp() is set.
  void runCall(const Host& h, const exec::CollCall& call);

  std::shared_ptr<exec::Engine> engine_;
  int64_t timeout_ms_;
  std::shared_ptr<CudaGroup> cuda_;  // null: CPU tensors only
  c10::intrusive_ptr<c10d::Store> store_;  // the set-up Store (Note [Splitting])
  // Note [Splitting]: the last child made, and the Store c10d handed over for it, which is new for each
  // split (held, so that no later Store can take its address).
  std::mutex split_mu_;
  c10::intrusive_ptr<c10d::Store> split_store_;
  c10::weak_intrusive_ptr<c10d::Backend> split_child_{c10::intrusive_ptr<c10d::Backend>()};
  std::atomic<uint64_t> issued_{0};  // collectives issued (getSequenceNumberForGroup)
};

}  // namespace tilecomm::backend

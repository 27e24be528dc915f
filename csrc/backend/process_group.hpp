// The c10d glue: a torch.distributed Backend whose operations validate their
// inputs, prepare the buffer a schedule runs over, and hand the call to the
// engine. No algorithm logic lives here.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>

#include "exec/engine.h"

namespace tilecomm::backend {

/// The engine's name for a torch dtype; nullopt for dtypes it can only move as bytes.
std::optional<DType> toDType(at::ScalarType t);

class TilecommWork : public c10d::Work {
 public:
  TilecommWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override { return source_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  /// Marks the work done (successfully when eptr is null) and completes its future.
  void complete(std::exception_ptr eptr, int source = -1);

 private:
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;  // inputs and scratch buffers alive until done
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int source_ = -1;
};

class ProcessGroupTilecomm : public c10d::Backend {
 public:
  ProcessGroupTilecomm(std::shared_ptr<exec::Engine> engine, int64_t timeout_ms);

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
  uint64_t getSequenceNumberForGroup() override { return 0; }

  exec::Engine& engine() { return *engine_; }

 private:
  using Body = std::function<void()>;
  /// The one generic path of every collective (c10d's collective() habit).
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, bool async, std::vector<at::Tensor> outputs,
                                        std::vector<at::Tensor> keep, Body body);
  c10::intrusive_ptr<c10d::Work> pointToPoint(c10d::OpType type, at::Tensor& t, int peer, int tag);
  /// Runs an in-place reducing schedule over t (all_reduce, reduce, reduce_scatter).
  void reduceOver(Coll coll, at::Tensor& t, const c10d::ReduceOp& op, int root, uint64_t desc_count,
                  int64_t timeout_ms);
  void move(Coll coll, at::Tensor& t, int root, uint64_t desc_count, int64_t timeout_ms);

  std::shared_ptr<exec::Engine> engine_;
  int64_t timeout_ms_;
};

}  // namespace tilecomm::backend

#include "backend/process_group.hpp"

#include <c10/util/Exception.h>

#include "common/error.h"
#include "kernels/reduce.h"

namespace tilecomm::backend {

namespace {

// ---- errors ----

std::exception_ptr toException(const Error& e) {
  try {
    if (e.kind() == ErrorKind::kInvalid) C10_THROW_ERROR(ValueError, e.what());
    C10_THROW_ERROR(DistBackendError, std::string("tilecomm: ") + e.what());
  } catch (...) {
    return std::current_exception();
  }
}

std::exception_ptr failedGroup(const std::string& why) {
  try {
    C10_THROW_ERROR(DistBackendError, "tilecomm: the process group has failed and cannot run more operations: " + why);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

std::optional<DType> toDType(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kChar: return DType::kInt8;
    case at::kByte: return DType::kUInt8;
    case at::kShort: return DType::kInt16;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kBool: return DType::kBool;
    case at::kComplexFloat: return DType::kComplex64;
    case at::kComplexDouble: return DType::kComplex128;
    default: return std::nullopt;
  }
}

namespace {

// ---- validation ----

void checkTensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.defined(), "tilecomm: ", what, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "tilecomm: ", what, " is on ", t.device(),
                    " but this tilecomm build supports only CPU tensors");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "tilecomm: ", what, " must be a dense (strided) tensor, got ",
                    t.layout());
  TORCH_CHECK_VALUE(t.is_contiguous(), "tilecomm: ", what, " must be contiguous (call .contiguous() first)");
}

at::Tensor single(std::vector<at::Tensor>& ts, const char* what) {
  TORCH_CHECK_VALUE(ts.size() == 1, "tilecomm: expected exactly one ", what, " tensor, got ", ts.size());
  checkTensor(ts[0], what);
  return ts[0];
}

void checkSame(const at::Tensor& ref, const at::Tensor& t, const char* what, size_t i, bool same_numel = true) {
  checkTensor(t, what);
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), "tilecomm: ", what, "[", i, "] has dtype ",
                   t.scalar_type(), " but the input has ", ref.scalar_type());
  TORCH_CHECK_VALUE(!same_numel || t.numel() == ref.numel(), "tilecomm: ", what, "[", i, "] has ", t.numel(),
                    " elements but the input has ", ref.numel());
}

void checkRank(int r, int size, const char* what) {
  TORCH_CHECK_VALUE(r >= 0 && r < size, "tilecomm: invalid ", what, " ", r, " for a group of size ", size);
}

RedOp engineOp(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
    case c10d::ReduceOp::PREMUL_SUM: return RedOp::kSum;
    case c10d::ReduceOp::PRODUCT: return RedOp::kProduct;
    case c10d::ReduceOp::MIN: return RedOp::kMin;
    case c10d::ReduceOp::MAX: return RedOp::kMax;
    case c10d::ReduceOp::BAND: return RedOp::kBand;
    case c10d::ReduceOp::BOR: return RedOp::kBor;
    case c10d::ReduceOp::BXOR: return RedOp::kBxor;
    default: TORCH_CHECK_VALUE(false, "tilecomm: unsupported ReduceOp ", static_cast<int>(op.op_));
  }
}

/// Checks that op is defined on t's dtype; returns the engine dtype.
DType checkReduction(const at::Tensor& t, const c10d::ReduceOp& op) {
  auto dt = toDType(t.scalar_type());
  TORCH_CHECK_TYPE(dt.has_value(), "tilecomm: cannot reduce tensors of dtype ", t.scalar_type());
  bool floating = at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type());
  if (op.op_ == c10d::ReduceOp::PREMUL_SUM)
    TORCH_CHECK_TYPE(floating, "tilecomm: PREMUL_SUM needs a floating-point or complex dtype, got ", t.scalar_type());
  if (op.op_ == c10d::ReduceOp::AVG)
    TORCH_CHECK_TYPE(t.scalar_type() != at::kBool, "tilecomm: AVG is not defined on bool tensors");
  std::string why = kernels::checkReducible(*dt, engineOp(op));
  TORCH_CHECK_TYPE(why.empty(), "tilecomm: ", why);
  return *dt;
}

int64_t timeoutOf(std::chrono::milliseconds t, int64_t dflt) { return t.count() > 0 ? t.count() : dflt; }

char* bytes(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

}  // namespace

// ---------------------------------------------------------------- Work

TilecommWork::TilecommWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep)
    : c10d::Work(rank, type), outputs_(std::move(outputs)), keep_(std::move(keep)) {
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

bool TilecommWork::isCompleted() {
  std::lock_guard<std::mutex> lk(mutex_);
  return completed_;
}

bool TilecommWork::isSuccess() const {
  std::lock_guard<std::mutex> lk(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr TilecommWork::exception() const {
  std::lock_guard<std::mutex> lk(mutex_);
  return exception_;
}

void TilecommWork::complete(std::exception_ptr eptr, int source) {
  source_ = source;
  keep_.clear();
  finish(eptr);  // wakes wait()
  // NOTE: future callbacks (DDP's) run here, on the thread that completed the op.
  if (eptr) {
    future_->setError(eptr);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

// ---------------------------------------------------------------- backend

ProcessGroupTilecomm::ProcessGroupTilecomm(std::shared_ptr<exec::Engine> engine, int64_t timeout_ms)
    : c10d::Backend(engine->rank(), engine->world()), engine_(std::move(engine)), timeout_ms_(timeout_ms) {}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::launch(c10d::OpType type, bool async,
                                                          std::vector<at::Tensor> outputs,
                                                          std::vector<at::Tensor> keep, Body body) {
  auto work = c10::make_intrusive<TilecommWork>(rank_, type, std::move(outputs), std::move(keep));
  auto result = std::make_shared<std::exception_ptr>();
  exec::Engine::Task task;
  task.run = [this, result, body = std::move(body)]() {
    std::string failed = engine_->failure();
    if (!failed.empty()) {
      *result = failedGroup(failed);
      return;
    }
    try {
      body();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInvalid) engine_->fail(e.what(), e.kind() != ErrorKind::kAborted);
      *result = toException(e);
    } catch (...) {
      *result = std::current_exception();
    }
  };
  task.done = [work, result]() { work->complete(*result); };
  // NOTE: an operation issued from a Future callback (on the worker thread) runs
  // right away; queued behind the callback's own task it would never run.
  if (async && !engine_->onWorkerThread()) {
    engine_->submit(std::move(task));
  } else {
    engine_->runNow(std::move(task));
  }
  return work;
}

void ProcessGroupTilecomm::reduceOver(Coll coll, at::Tensor& t, const c10d::ReduceOp& op, int root,
                                      uint64_t desc_count, int64_t timeout_ms) {
  if (op.op_ == c10d::ReduceOp::PREMUL_SUM) {
    auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
    TORCH_CHECK_VALUE(s, "tilecomm: PREMUL_SUM without a factor");
    if (s->tensor_factor.defined()) {
      t.mul_(s->tensor_factor.to(t.device(), t.scalar_type()));
    } else {
      t.mul_(s->double_factor);
    }
  }
  uint64_t nbytes = t.nbytes();
  engine_->run(exec::CollCall{coll, engine_->pick(coll, nbytes), bytes(t), static_cast<uint64_t>(t.numel()),
                              *toDType(t.scalar_type()), engineOp(op), root, desc_count, timeout_ms});
}

void ProcessGroupTilecomm::move(Coll coll, at::Tensor& t, int root, uint64_t desc_count, int64_t timeout_ms) {
  auto dt = toDType(t.scalar_type());
  DType d = dt.value_or(DType::kBytes);
  uint64_t count = dt ? t.numel() : t.nbytes();
  engine_->run(exec::CollCall{coll, engine_->pick(coll, t.nbytes()), bytes(t), count, d, RedOp::kNone, root,
                              desc_count, timeout_ms});
}

namespace {
/// AVG: the sum divided by the group size (integers truncate toward zero).
void finishAverage(at::Tensor& t, const c10d::ReduceOp& op, int size) {
  if (op.op_ != c10d::ReduceOp::AVG) return;
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
    t.div_(size, "trunc");
  } else if (t.is_complex()) {
    at::view_as_real(t).div_(size);  // per component, correctly rounded (complex division is not)
  } else {
    t.div_(size);
  }
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  at::Tensor t = single(tensors, "all_reduce");
  checkReduction(t, opts.reduceOp);
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  auto op = opts.reduceOp;
  return launch(c10d::OpType::ALLREDUCE, opts.asyncOp, {t}, {}, [=]() mutable {
    reduceOver(Coll::kAllReduce, t, op, -1, t.numel(), timeout);
    finishAverage(t, op, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "tilecomm: all_reduce_coalesced needs at least one tensor");
  for (size_t i = 0; i < tensors.size(); ++i) {
    checkSame(tensors[0], tensors[i], "all_reduce_coalesced tensor", i, false);
    checkReduction(tensors[i], opts.reduceOp);
  }
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  auto op = opts.reduceOp;
  std::vector<at::Tensor> ts = tensors;
  return launch(c10d::OpType::ALLREDUCE_COALESCED, opts.asyncOp, ts, {}, [=]() mutable {
    std::vector<at::Tensor> flat;
    for (auto& t : ts) flat.push_back(t.reshape({-1}));
    at::Tensor buf = at::cat(flat);
    reduceOver(Coll::kAllReduce, buf, op, -1, buf.numel(), timeout);
    finishAverage(buf, op, size_);
    int64_t off = 0;
    for (auto& t : ts) {
      t.view({-1}).copy_(buf.narrow(0, off, t.numel()));
      off += t.numel();
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  at::Tensor t = single(tensors, "broadcast");
  int root = static_cast<int>(opts.rootRank);
  checkRank(root, size_, "root");
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  return launch(c10d::OpType::BROADCAST, opts.asyncOp, {t}, {},
                [=]() mutable { move(Coll::kBroadcast, t, root, t.numel(), timeout); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  at::Tensor t = single(tensors, "reduce");
  checkReduction(t, opts.reduceOp);
  int root = static_cast<int>(opts.rootRank);
  checkRank(root, size_, "root");
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  auto op = opts.reduceOp;
  return launch(c10d::OpType::REDUCE, opts.asyncOp, {t}, {}, [=]() mutable {
    // Only the root's tensor changes; other ranks reduce in a scratch copy.
    at::Tensor buf = rank_ == root ? t : t.clone();
    reduceOver(Coll::kReduce, buf, op, root, t.numel(), timeout);
    if (rank_ == root) finishAverage(t, op, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  checkTensor(input, "all_gather input");
  checkTensor(output, "all_gather output");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "tilecomm: all_gather output has dtype ",
                   output.scalar_type(), " but the input has ", input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "tilecomm: all_gather output has ", output.numel(),
                    " elements; expected world size (", size_, ") x input (", input.numel(), ")");
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  at::Tensor in = input, out = output;
  return launch(c10d::OpType::_ALLGATHER_BASE, opts.asyncOp, {out}, {in}, [=]() mutable {
    at::Tensor flat = out.view({-1});
    flat.narrow(0, rank_ * in.numel(), in.numel()).copy_(in.view({-1}));
    move(Coll::kAllGather, flat, -1, in.numel(), timeout);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  at::Tensor in = single(inputs, "all_gather input");
  TORCH_CHECK_VALUE(outputs.size() == 1, "tilecomm: expected one output list, got ", outputs.size());
  std::vector<at::Tensor> outs = outputs[0];
  TORCH_CHECK_VALUE(static_cast<int>(outs.size()) == size_, "tilecomm: all_gather output list has ", outs.size(),
                    " tensors; expected the world size ", size_);
  for (size_t i = 0; i < outs.size(); ++i) checkSame(in, outs[i], "all_gather output", i);
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  return launch(c10d::OpType::ALLGATHER, opts.asyncOp, outs, {in}, [=]() mutable {
    at::Tensor buf = at::empty({size_ * in.numel()}, in.options());
    buf.narrow(0, rank_ * in.numel(), in.numel()).copy_(in.view({-1}));
    move(Coll::kAllGather, buf, -1, in.numel(), timeout);
    for (int r = 0; r < size_; ++r) outs[r].view({-1}).copy_(buf.narrow(0, r * in.numel(), in.numel()));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "tilecomm: all_gather_coalesced has ", inputs.size(),
                    " inputs but ", outputs.size(), " output lists");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<at::Tensor> all_out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> o{outputs[i]};
    std::vector<at::Tensor> in{inputs[i]};
    works.push_back(allgather(o, in, opts));
    all_out.insert(all_out.end(), outputs[i].begin(), outputs[i].end());
  }
  // One work for the batch, issued after its parts, so it runs once they are done.
  return launch(c10d::OpType::ALLGATHER_COALESCED, opts.asyncOp, all_out, {}, [works]() {
    for (auto& w : works) w->wait();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "tilecomm: all_gather_into_tensor_coalesced has ",
                    inputs.size(), " inputs but ", outputs.size(), " outputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_allgather_base(outputs[i], inputs[i], opts));
  return launch(c10d::OpType::COALESCED, opts.asyncOp, outputs, {}, [works]() {
    for (auto& w : works) w->wait();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  checkTensor(input, "reduce_scatter input");
  checkTensor(output, "reduce_scatter output");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "tilecomm: reduce_scatter output has dtype ",
                   output.scalar_type(), " but the input has ", input.scalar_type());
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "tilecomm: reduce_scatter input has ", input.numel(),
                    " elements; expected world size (", size_, ") x output (", output.numel(), ")");
  checkReduction(input, opts.reduceOp);
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  auto op = opts.reduceOp;
  at::Tensor in = input, out = output;
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, opts.asyncOp, {out}, {in}, [=]() mutable {
    at::Tensor buf = in.reshape({-1}).clone();
    reduceOver(Coll::kReduceScatter, buf, op, -1, out.numel(), timeout);
    out.view({-1}).copy_(buf.narrow(0, rank_ * out.numel(), out.numel()));
    finishAverage(out, op, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = single(outputs, "reduce_scatter output");
  TORCH_CHECK_VALUE(inputs.size() == 1, "tilecomm: expected one input list, got ", inputs.size());
  std::vector<at::Tensor> ins = inputs[0];
  TORCH_CHECK_VALUE(static_cast<int>(ins.size()) == size_, "tilecomm: reduce_scatter input list has ", ins.size(),
                    " tensors; expected the world size ", size_);
  for (size_t i = 0; i < ins.size(); ++i) checkSame(out, ins[i], "reduce_scatter input", i);
  checkReduction(out, opts.reduceOp);
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  auto op = opts.reduceOp;
  return launch(c10d::OpType::REDUCE_SCATTER, opts.asyncOp, {out}, ins, [=]() mutable {
    std::vector<at::Tensor> flat;
    for (auto& t : ins) flat.push_back(t.reshape({-1}));
    at::Tensor buf = at::cat(flat);
    reduceOver(Coll::kReduceScatter, buf, op, -1, out.numel(), timeout);
    out.view({-1}).copy_(buf.narrow(0, rank_ * out.numel(), out.numel()));
    finishAverage(out, op, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "tilecomm: reduce_scatter_tensor_coalesced has ",
                    inputs.size(), " inputs but ", outputs.size(), " outputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  return launch(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, opts.asyncOp, outputs, {}, [works]() {
    for (auto& w : works) w->wait();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  at::Tensor in = single(inputs, "gather input");
  int root = static_cast<int>(opts.rootRank);
  checkRank(root, size_, "root");
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                      "tilecomm: gather on the root needs one output list of world size (", size_, ") tensors");
    outs = outputs[0];
    for (size_t i = 0; i < outs.size(); ++i) checkSame(in, outs[i], "gather output", i);
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                      "tilecomm: gather takes output tensors only on the root");
  }
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  return launch(c10d::OpType::GATHER, opts.asyncOp, outs, {in}, [=]() mutable {
    // The schedule's buffer holds blocks in order of rank relative to the root.
    int64_t n = in.numel();
    int v = (rank_ - root + size_) % size_;
    at::Tensor buf = at::empty({size_ * n}, in.options());
    buf.narrow(0, v * n, n).copy_(in.view({-1}));
    move(Coll::kGather, buf, root, n, timeout);
    if (rank_ == root)
      for (int u = 0; u < size_; ++u) outs[(u + root) % size_].view({-1}).copy_(buf.narrow(0, u * n, n));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  at::Tensor out = single(outputs, "scatter output");
  int root = static_cast<int>(opts.rootRank);
  checkRank(root, size_, "root");
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                      "tilecomm: scatter on the root needs one input list of world size (", size_, ") tensors");
    ins = inputs[0];
    for (size_t i = 0; i < ins.size(); ++i) checkSame(out, ins[i], "scatter input", i);
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                      "tilecomm: scatter takes input tensors only on the root");
  }
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  return launch(c10d::OpType::SCATTER, opts.asyncOp, {out}, ins, [=]() mutable {
    int64_t n = out.numel();
    int v = (rank_ - root + size_) % size_;
    at::Tensor buf = at::empty({size_ * n}, out.options());
    if (rank_ == root)
      for (int u = 0; u < size_; ++u) buf.narrow(0, u * n, n).copy_(ins[(u + root) % size_].view({-1}));
    move(Coll::kScatter, buf, root, n, timeout);
    out.view({-1}).copy_(buf.narrow(0, v * n, n));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions& opts) {
  checkTensor(input, "all_to_all input");
  checkTensor(output, "all_to_all output");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "tilecomm: all_to_all output has dtype ",
                   output.scalar_type(), " but the input has ", input.scalar_type());
  // Splits count rows of dim 0; no splits means equal parts.
  auto layout = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* what,
                    std::vector<size_t>& off, std::vector<size_t>& len) {
    int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    size_t row_bytes = rows > 0 ? t.nbytes() / rows : 0;
    if (splits.empty()) {
      TORCH_CHECK_VALUE(rows % size_ == 0, "tilecomm: all_to_all ", what, " has ", rows,
                        " rows, which the world size ", size_, " does not divide");
    } else {
      TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size_, "tilecomm: all_to_all ", what, " split sizes have ",
                        splits.size(), " entries; expected the world size ", size_);
    }
    size_t at = 0;
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      int64_t s = splits.empty() ? rows / size_ : splits[r];
      TORCH_CHECK_VALUE(s >= 0, "tilecomm: negative all_to_all split size ", s);
      off.push_back(at);
      len.push_back(s * row_bytes);
      at += s * row_bytes;
      total += s;
    }
    TORCH_CHECK_VALUE(total == rows, "tilecomm: all_to_all ", what, " split sizes add up to ", total, " but dim 0 is ",
                      rows);
  };
  std::vector<size_t> in_off, in_len, out_off, out_len;
  layout(input, input_splits, "input", in_off, in_len);
  layout(output, output_splits, "output", out_off, out_len);
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  at::Tensor in = input, out = output;
  return launch(c10d::OpType::ALLTOALL_BASE, opts.asyncOp, {out}, {in}, [=]() {
    engine_->allToAll(bytes(in), in_off, in_len, bytes(out), out_off, out_len, timeout);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
                    "tilecomm: all_to_all needs world size (", size_, ") input and output tensors, got ",
                    inputs.size(), " and ", outputs.size());
  std::vector<size_t> in_off, in_len, out_off, out_len;
  for (int r = 0; r < size_; ++r) {
    checkSame(inputs[0], inputs[r], "all_to_all input", r, false);
    checkSame(inputs[0], outputs[r], "all_to_all output", r, false);
    // Offsets from address zero: each peer's block is its own tensor.
    in_off.push_back(reinterpret_cast<size_t>(inputs[r].data_ptr()));
    in_len.push_back(inputs[r].nbytes());
    out_off.push_back(reinterpret_cast<size_t>(outputs[r].data_ptr()));
    out_len.push_back(outputs[r].nbytes());
  }
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  return launch(c10d::OpType::ALLTOALL, opts.asyncOp, outputs, inputs, [=]() {
    engine_->allToAll(nullptr, in_off, in_len, nullptr, out_off, out_len, timeout);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::barrier(const c10d::BarrierOptions& opts) {
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  return launch(c10d::OpType::BARRIER, true, {}, {}, [=]() {
    engine_->run(exec::CollCall{Coll::kBarrier, engine_->pick(Coll::kBarrier, 0), nullptr, 0, DType::kBytes,
                                RedOp::kNone, -1, 0, timeout});
  });
}

void ProcessGroupTilecomm::monitoredBarrier(const c10d::BarrierOptions& opts, bool /*wait_all_ranks*/) {
  // A timeout already names the ranks that did not arrive.
  barrier(opts)->wait();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::pointToPoint(c10d::OpType type, at::Tensor& t, int peer,
                                                                int tag) {
  checkTensor(t, type == c10d::OpType::SEND ? "send tensor" : "recv tensor");
  if (type != c10d::OpType::RECVANYSOURCE) {
    checkRank(peer, size_, "peer rank");
    TORCH_CHECK_VALUE(peer != rank_, "tilecomm: rank ", rank_, " cannot send to or receive from itself");
  }
  auto work = c10::make_intrusive<TilecommWork>(rank_, type, std::vector<at::Tensor>{t}, std::vector<at::Tensor>{t});
  std::string failed = engine_->failure();
  if (!failed.empty()) {
    work->complete(failedGroup(failed));
    return work;
  }
  exec::P2POp op;
  op.send = type == c10d::OpType::SEND;
  op.peer = peer;
  op.tag = tag;
  op.ptr = bytes(t);
  op.nbytes = t.nbytes();
  op.timeout_ms = timeout_ms_;
  op.done = [work](int src, const std::string& err) {
    if (err.empty()) return work->complete(nullptr, src);
    bool bad_input = err.find(" but the receive posted ") != std::string::npos;
    work->complete(toException(Error(bad_input ? ErrorKind::kInvalid : ErrorKind::kPeerFailed, err)), src);
  };
  engine_->p2p().post(std::move(op));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  at::Tensor t = single(tensors, "send");
  return pointToPoint(c10d::OpType::SEND, t, dst, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  at::Tensor t = single(tensors, "recv");
  return pointToPoint(c10d::OpType::RECV, t, src, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  at::Tensor t = single(tensors, "recv");
  return pointToPoint(c10d::OpType::RECVANYSOURCE, t, -1, tag);
}

}  // namespace tilecomm::backend

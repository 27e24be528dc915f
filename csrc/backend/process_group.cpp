#include "backend/process_group.hpp"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>

#include "common/error.h"
#include "common/host_stages.h"
#include "kernels/reduce.h"

#ifdef TILECOMM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "backend/cuda_glue.hpp"
#endif

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

/// A point-to-point operation's failure from the engine: a size mismatch is the caller's error.
std::exception_ptr p2pException(const std::string& err) {
  bool bad_input = err.find(" but the receive posted ") != std::string::npos;
  return toException(Error(bad_input ? ErrorKind::kInvalid : ErrorKind::kPeerFailed, err));
}

/// A point-to-point operation's completion: the Work completes with the engine's outcome.
std::function<void(int, const std::string&)> p2pDone(c10::intrusive_ptr<TilecommWork> work) {
  return [work](int src, const std::string& err) { work->complete(err.empty() ? nullptr : p2pException(err), src); };
}

#ifdef TILECOMM_WITH_CUDA
/// The completion of a receive into CUDA tensor t whose bytes arrive in pinned `host`: they are
/// copied to t on op's stream, then the Work completes.
std::function<void(int, const std::string&)> landOnGpu(c10::intrusive_ptr<TilecommWork> work,
                                                       std::shared_ptr<CudaOp> cop, at::Tensor t, at::Tensor host) {
  return [work, cop, t, host](int src, const std::string& err) {
    if (!err.empty()) return work->complete(p2pException(err), src);
    try {
      copyFromHost(*cop, t, host);
    } catch (...) {
      return work->complete(std::current_exception(), src);
    }
    work->complete(nullptr, src);
  };
}
#endif

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
#ifdef TILECOMM_WITH_CUDA
  TORCH_CHECK_VALUE(t.device().is_cpu() || t.device().is_cuda(), "tilecomm: ", what, " is on ", t.device(),
                    " but tilecomm supports only CPU and CUDA tensors");
#else
  TORCH_CHECK_VALUE(t.device().is_cpu(), "tilecomm: ", what, " is on ", t.device(),
                    " but this tilecomm build supports only CPU tensors");
#endif
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "tilecomm: ", what, " must be a dense (strided) tensor, got ",
                    t.layout());
  // CPU tensors may be strided (Note [Strided CPU tensors]); CUDA ones must be contiguous, as with NCCL.
  TORCH_CHECK_VALUE(!t.is_cuda() || t.is_contiguous(), "tilecomm: ", what,
                    " is a CUDA tensor that is not contiguous (call .contiguous() first)");
}

// Note [Strided CPU tensors]
// Scripts written for Gloo pass CPU tensors that are not contiguous (a transposed weight, a slice
// with a step) to collectives; Gloo takes them (and reduces the first elements of their memory,
// strides ignored). tilecomm's task works on contiguous copies of them, made when it runs (so an
// earlier call's result is what it reads) and copied back into the tensors it writes. Contiguous
// tensors, the usual case, cost one flag test each. An output whose elements share memory (an
// expanded tensor) is refused; point-to-point moves the tensor's own bytes and wants it
// contiguous, as Gloo's does.
void runStrided(const std::vector<at::Tensor>& reads, const std::vector<at::Tensor>& writes,
                const std::function<void(const Host&)>& body) {
  Host host;
  for (const auto* ts : {&reads, &writes})
    for (const at::Tensor& t : *ts)
      if (!host.has(t)) host.add(t, t.contiguous());  // a copy: what the body does not write keeps its values
  body(host);
  for (const at::Tensor& t : writes) t.copy_(host(t));
}

bool strided(const at::Tensor& t) { return t.layout() == at::kStrided && !t.is_contiguous(); }

at::Tensor single(std::vector<at::Tensor>& ts, const char* what) {
  TORCH_CHECK_VALUE(ts.size() == 1, "tilecomm: expected exactly one ", what, " tensor, got ", ts.size());
  checkTensor(ts[0], what);
  return ts[0];
}

/// `what` (with `[index]` when index >= 0) must be on ref's device.
void checkDevice(const at::Tensor& ref, const at::Tensor& t, const char* what, int64_t index = -1) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), "tilecomm: ", what,
                    index >= 0 ? "[" + std::to_string(index) + "]" : std::string(), " is on ", t.device(),
                    " but the call's other tensors are on ", ref.device(), " (all must be on one device)");
}

void checkSame(const at::Tensor& ref, const at::Tensor& t, const char* what, size_t i, bool same_numel = true) {
  checkTensor(t, what);
  checkDevice(ref, t, what, static_cast<int64_t>(i));
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

// OpType::REDUCE_SCATTER_TENSOR_COALESCED where this torch has it (not in 2.11), else COALESCED.
template <typename E, typename = void>
struct RsTensorCoalesced {
  static constexpr E value = E::COALESCED;
};
template <typename E>
struct RsTensorCoalesced<E, std::void_t<decltype(E::REDUCE_SCATTER_TENSOR_COALESCED)>> {
  static constexpr E value = E::REDUCE_SCATTER_TENSOR_COALESCED;
};
constexpr c10d::OpType kReduceScatterTensorCoalesced = RsTensorCoalesced<c10d::OpType>::value;

int64_t timeoutOf(std::chrono::milliseconds t, int64_t dflt) { return t.count() > 0 ? t.count() : dflt; }

char* bytes(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

}  // namespace

// ---------------------------------------------------------------- Work

TilecommWork::TilecommWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
                           std::shared_ptr<CudaOp> cuda)
    : c10d::Work(rank, type), outputs_(std::move(outputs)), keep_(std::move(keep)), cuda_(std::move(cuda)) {}

bool TilecommWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lk(mutex_);
    if (!completed_) return false;
  }
#ifdef TILECOMM_WITH_CUDA
  if (cuda_ && !cuda_->captured) return cuda_->endReached();  // Note [CUDA graphs]: no query under capture
#endif
  return true;
}

bool TilecommWork::wait(std::chrono::milliseconds timeout) {
  bool done = c10d::Work::wait(timeout);  // the host part; then synchronize()
#ifdef TILECOMM_WITH_CUDA
  // NOTE: the end event is queried only once a direct kernel of the group has failed (a word in
  // mapped host memory says so), not on every call.
  if (cuda_ && cuda_->direct_launch != 0 && !cuda_->captured && cuda_->ipc && cuda_->ipc->failedLaunch() != 0 &&
      cuda_->endReached()) {
    std::string err = cuda_->directError();
    if (!err.empty()) C10_THROW_ERROR(DistBackendError, "tilecomm: " + err);
  }
#endif
  host_stages::mark(host_stages::Stage::kWaited);
  return done;
}

void TilecommWork::synchronize() {
#ifdef TILECOMM_WITH_CUDA
  if (cuda_) cuda_->waitEnd();
#endif
}

bool TilecommWork::isSuccess() const {
  std::lock_guard<std::mutex> lk(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr TilecommWork::exception() const {
  std::lock_guard<std::mutex> lk(mutex_);
  return exception_;
}

c10::intrusive_ptr<c10::ivalue::Future> TilecommWork::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> f;
  bool finished = false;
  {
    std::lock_guard<std::mutex> lk(future_mu_);
    if (future_) return future_;
    std::vector<c10::Device> devices;
#ifdef TILECOMM_WITH_CUDA
    if (cuda_) devices.push_back(cuda_->device);  // a device-aware Future (Note [CUDA streams])
#endif
    f = future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(), devices);
    finished = finished_;
  }
  if (finished) completeFuture(*f);  // the op was done before anyone asked for its Future
  return f;
}

void TilecommWork::complete(std::exception_ptr eptr, int source) {
  source_ = source;
  keep_.clear();
  result_ = eptr;  // read by completeFuture after the lock below, or by a later getFuture
  c10::intrusive_ptr<c10::ivalue::Future> f;
  {
    // NOTE: before finish(): a Future first asked for once wait() returned is made done (one made
    // earlier may still be completing for a moment when wait() returns, as before).
    std::lock_guard<std::mutex> lk(future_mu_);
    finished_ = true;
    f = future_;
  }
  finish(eptr);  // wakes wait()
  if (f) completeFuture(*f);
}

void TilecommWork::completeFuture(c10::ivalue::Future& future) {
  // NOTE: exactly one caller gets here per Work: complete() when the Future existed before the op
  // was done, else the getFuture() call that made it. Future callbacks (DDP's) run here, on that
  // thread, without a lock of ours held (a callback may issue more operations).
  if (result_) {
    future.setError(result_);
    return;
  }
#ifdef TILECOMM_WITH_CUDA
  if (cuda_) {  // the Future's events go on the operation's stream, after it
    c10::cuda::CUDAGuard device_guard(cuda_->device);
    c10::cuda::CUDAStreamGuard stream_guard(cuda_->stream);
    future.markCompleted(c10::IValue(outputs_));
    return;
  }
#endif
  future.markCompleted(c10::IValue(outputs_));
}

// ---------------------------------------------------------------- backend

namespace {
ProcessGroupTilecomm::SplitHook& splitHook() {
  static ProcessGroupTilecomm::SplitHook hook;
  return hook;
}
}  // namespace

void ProcessGroupTilecomm::setSplitHook(SplitHook hook) { splitHook() = std::move(hook); }

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupTilecomm::getBackendOptions() {
  auto opts = c10::make_intrusive<c10d::Backend::Options>(getBackendName(), std::chrono::milliseconds(timeout_ms_));
  opts->group_name = getGroupUid();
  return opts;
}

// Note [Splitting]
c10::intrusive_ptr<c10d::Backend> ProcessGroupTilecomm::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                              const std::vector<int>& ranks,
                                                              const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i)
    TORCH_CHECK_VALUE(sorted[i] >= 0 && sorted[i] < size_ && (i == 0 || sorted[i] != sorted[i - 1]),
                      "tilecomm: split: ranks must be distinct ranks of this group (0..", size_ - 1, ")");
  const auto me = std::find(sorted.begin(), sorted.end(), rank_);
  if (me == sorted.end()) return nullptr;  // not in the child: nothing to do here
  TORCH_CHECK(splitHook(), "tilecomm: split: the Python side of tilecomm is not loaded");
  const std::string name = opts ? opts->group_name : std::string();
  std::lock_guard<std::mutex> lk(split_mu_);
  if (split_store_ == store) {
    if (auto child = split_child_.lock()) return child;  // the same child, for another device type
  }
  const int64_t timeout = opts ? static_cast<int64_t>(opts->timeout.count()) : timeout_ms_;
  std::string members;
  for (int r : sorted) members += (members.empty() ? "" : ",") + std::to_string(r);
  auto scoped = c10::make_intrusive<c10d::PrefixStore>("tilecomm-split[" + members + "]", store_);
  auto child = splitHook()(scoped, static_cast<int>(me - sorted.begin()), static_cast<int>(sorted.size()), timeout,
                           name);
  split_store_ = store;
  split_child_ = child;
  return child;
}

ProcessGroupTilecomm::ProcessGroupTilecomm(std::shared_ptr<exec::Engine> engine, int64_t timeout_ms,
                                           c10::intrusive_ptr<c10d::Store> store)
    : c10d::Backend(engine->rank(), engine->world()),
      engine_(std::move(engine)),
      timeout_ms_(timeout_ms),
      store_(std::move(store)) {
  TORCH_CHECK_VALUE(store_, "tilecomm: a group needs the Store it was set up through");
}

ProcessGroupTilecomm::~ProcessGroupTilecomm() {
#ifdef TILECOMM_WITH_CUDA
  // Note [Direct point-to-point]: the replies behind the last copies go out before the thread stops.
  if (cuda_) {
    cuda_->p2pDrain();
    engine_->p2p().flushInternalSends(std::chrono::seconds(1));
  }
#endif
  engine_->p2p().stop();
}

void ProcessGroupTilecomm::setCuda(std::shared_ptr<CudaGroup> cuda) {
  cuda_ = std::move(cuda);
#ifdef TILECOMM_WITH_CUDA
  if (cuda_) cuda_->setEngine(engine_);
#endif
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::launch(c10d::OpType type, bool async,
                                                          std::vector<at::Tensor> outputs,
                                                          std::vector<at::Tensor> reads,
                                                          std::vector<at::Tensor> writes, Body body, Direct direct,
                                                          bool on_device) {
  // A CUDA call's extra state (Note [CUDA streams]); null for CPU calls, which keep
  // their inputs alive through the Work (their outputs are its result).
  struct CudaCall {
    std::shared_ptr<CudaOp> op;
    std::vector<at::Tensor> reads, writes, keep;
    Direct direct;
    bool on_device = false;
  };
  std::shared_ptr<CudaCall> cc;
#ifdef TILECOMM_WITH_CUDA
  const at::Tensor* first = !reads.empty() ? &reads[0] : !writes.empty() ? &writes[0] : !outputs.empty() ? &outputs[0]
                                                                                                        : nullptr;
  for (const auto* ts : {&reads, &writes, &outputs})
    for (const at::Tensor& t : *ts)
      TORCH_CHECK_VALUE(t.device() == first->device(), "tilecomm: ", c10d::opTypeToString(type),
                        " mixes tensors on ", first->device(), " and ", t.device(), " (all must be on one device)");
  if (first && first->is_cuda()) {
    TORCH_CHECK_VALUE(cuda_, "tilecomm: this process group was created without CUDA support");
    cc = std::make_shared<CudaCall>();
    // Note [Synchronous CUDA calls]: a synchronous call that may run as a kernel runs on the
    // caller's stream; otherwise the ready event is recorded on it.
    cc->op = cuda_->beginCollective(first->device(), !async && (direct || on_device));
    cc->op->issued = issued_.load(std::memory_order_relaxed);  // Note [Registered tensors]
    TORCH_CHECK_VALUE(!cc->op->captured || direct || on_device, "tilecomm: ", c10d::opTypeToString(type),
                      " on CUDA tensors cannot be captured in a CUDA graph: it runs staged through host memory "
                      "(point-to-point, complex reductions, and groups without a GPU peer transport are staged)");
    cc->keep = reads;
    cc->keep.insert(cc->keep.end(), writes.begin(), writes.end());
    cc->reads = std::move(reads);
    cc->writes = std::move(writes);
    cc->direct = std::move(direct);
    cc->on_device = on_device;
    host_stages::mark(host_stages::Stage::kBegun);
  }
#else
  (void)direct, (void)on_device;
#endif
  std::vector<at::Tensor> strided_reads, strided_writes;  // Note [Strided CPU tensors]
  if (!cc) {
    for (const at::Tensor& t : reads)
      if (strided(t)) strided_reads.push_back(t);
    for (const at::Tensor& t : writes) {
      if (!strided(t)) continue;
      TORCH_CHECK_VALUE(at::has_internal_overlap(t) != at::MemOverlap::Yes, "tilecomm: ", c10d::opTypeToString(type),
                        " cannot write a tensor whose elements share memory (an expanded tensor)");
      strided_writes.push_back(t);
    }
  }
  issued_.fetch_add(1, std::memory_order_relaxed);  // a call refused above is not counted
  auto work = c10::make_intrusive<TilecommWork>(rank_, type, std::move(outputs), cc ? cc->keep : std::move(reads),
                                                cc ? cc->op : nullptr);
  auto result = std::make_shared<std::exception_ptr>();
  exec::Engine::Task task;
  task.run = [this, result, cc, body = std::move(body), sr = std::move(strided_reads),
              sw = std::move(strided_writes)]() {
    host_stages::mark(host_stages::Stage::kTurn);
    std::string failed = engine_->failure();
#ifdef TILECOMM_WITH_CUDA
    // A kernel of this rank that failed on the GPU fails the group, for CPU calls too, and tells the
    // peers; a peer's failure reaches calls that never wait on the CPU engine (direct kernels).
    if (failed.empty() && cuda_) {
      failed = cuda_->failure();
      if (!failed.empty()) engine_->fail(failed, true);
    }
    if (failed.empty() && cc) failed = engine_->peerFailure();
#endif
    if (!failed.empty()) {
      *result = failedGroup(failed);
      return;
    }
    try {
      // A collective is not differentiable: its writes into tensors that require grad (a strided
      // copy back, AVG's division) must not be seen by autograd, which is on by default on the
      // worker thread whatever the caller's mode.
      at::NoGradGuard no_grad;
#ifdef TILECOMM_WITH_CUDA
      if (cc) {
        cc->op->run(cc->keep, [&] {
          if (cc->direct && cc->direct(*cc->op)) return;
          // NOTE: directReady gives the same answer on every rank.
          if (cc->on_device && cuda_->directReady(*cc->op)) return body(Host(cc->op.get()));
          cuda_->runStaged(cc->reads, cc->writes, body);
        });
        return;
      }
#endif
      if (sr.empty() && sw.empty()) {
        body(Host{});
      } else {
        runStrided(sr, sw, body);
      }
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInvalid) engine_->fail(e.what(), e.kind() != ErrorKind::kAborted);
      *result = toException(e);
    } catch (...) {
      *result = std::current_exception();
    }
  };
  task.done = [work, result]() { work->complete(*result); };
  host_stages::mark(host_stages::Stage::kIssued);
  // Note [Host stages]: an asynchronous call's task may run on the engine's thread; and only the
  // collectives that mark their entry are recorded (a call of another kind ends any record left open).
  if (async || (type != c10d::OpType::ALLREDUCE && type != c10d::OpType::_ALLGATHER_BASE)) host_stages::drop();
  // NOTE: an operation issued from a Future callback (on the worker thread) runs
  // right away; queued behind the callback's own task it would never run.
  if (async && !engine_->onWorkerThread()) {
    engine_->submit(std::move(task));
  } else {
    engine_->runNow(std::move(task));
  }
  host_stages::mark(host_stages::Stage::kDone);
  return work;
}

namespace {
/// PREMUL_SUM: the factor is applied before the sum.
void premultiply(at::Tensor& t, const c10d::ReduceOp& op) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return;
  // NOTE: the NCCL-prefixed name exists in every torch this builds with (2.13 keeps it as an alias).
  auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK_VALUE(s, "tilecomm: PREMUL_SUM without a factor");
  if (s->tensor_factor.defined()) {
    t.mul_(s->tensor_factor.to(t.device(), t.scalar_type()));
  } else {
    t.mul_(s->double_factor);
  }
}
}  // namespace

void ProcessGroupTilecomm::runCall(const Host& h, const exec::CollCall& call) {
#ifdef TILECOMM_WITH_CUDA
  if (h.cudaOp()) return cuda_->runSchedule(*h.cudaOp(), call);
#else
  (void)h;
#endif
  engine_->run(call);
}

void ProcessGroupTilecomm::reduceOver(const Host& h, Coll coll, at::Tensor& t, const c10d::ReduceOp& op, int root,
                                      uint64_t desc_count, int64_t timeout_ms) {
  premultiply(t, op);
  runCall(h, exec::CollCall{coll, engine_->pick(coll, t.nbytes(), !h.cudaOp()), bytes(t),
                            static_cast<uint64_t>(t.numel()), *toDType(t.scalar_type()), engineOp(op), root,
                            desc_count, timeout_ms});
}

void ProcessGroupTilecomm::move(const Host& h, Coll coll, at::Tensor& t, int root, uint64_t desc_count,
                                int64_t timeout_ms) {
  auto dt = toDType(t.scalar_type());
  DType d = dt.value_or(DType::kBytes);
  uint64_t count = dt ? t.numel() : t.nbytes();
  runCall(h, exec::CollCall{coll, engine_->pick(coll, t.nbytes(), !h.cudaOp()), bytes(t), count, d, RedOp::kNone, root,
                            desc_count, timeout_ms});
}

bool ProcessGroupTilecomm::onDevice(Coll coll, const at::Tensor& t, RedOp op) const {
#ifdef TILECOMM_WITH_CUDA
  if (!cuda_ || !t.is_cuda()) return false;
  auto dt = toDType(t.scalar_type());
  return (dt || op == RedOp::kNone) && cuda_->scheduleEligible(coll, dt.value_or(DType::kBytes), op);
#else
  (void)coll, (void)t, (void)op;
  return false;
#endif
}

namespace {
/// AVG: the sum divided by the group size (integers truncate toward zero).
void finishAverage(at::Tensor& t, const c10d::ReduceOp& op, int size) {
  if (op.op_ != c10d::ReduceOp::AVG) return;
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
    t.div_(size, "trunc");
    return;
  }
  at::Tensor v = t.is_complex() ? at::view_as_real(t) : t;  // complex: per component (complex division is not
                                                           // correctly rounded)
  // NOTE: on CUDA, division by a host scalar multiplies by its reciprocal, which is off by one ulp
  // where 1 / size is inexact (3 ranks); a divisor on the device divides, correctly rounded as on the CPU.
  if (v.is_cuda()) v.div_(at::scalar_tensor(size, v.options()));
  else v.div_(size);
}
}  // namespace

ProcessGroupTilecomm::Direct ProcessGroupTilecomm::directAllReduce(const at::Tensor& t, DType dtype,
                                                                 const c10d::ReduceOp& op, int64_t timeout_ms) {
#ifdef TILECOMM_WITH_CUDA
  if (!cuda_) return nullptr;
  // The NVSHMEM two-shot where TILECOMM_CUDA_ALLREDUCE forces it, else a cuda_ipc kernel.
  const auto blocks = cuda_->allReduceBlocks(t.nbytes(), dtype, engineOp(op));
  if (!blocks && !cuda_->directEligible(t.nbytes(), dtype, engineOp(op))) return nullptr;
  return [this, t = at::Tensor(t), dtype, op, blocks, timeout_ms](CudaOp& cop) mutable {
    // the same answer on every rank
    const auto run = blocks ? cuda_->nvshmemReady(cop, *blocks) : std::nullopt;
    if (blocks ? !run : !cuda_->directReady(cop)) return false;
    premultiply(t, op);  // torch ops, on the operation's stream (the current one here)
    if (run) {
      cuda::BlockCall call;
      call.in[0] = call.out[0] = t.data_ptr();
      call.nbytes = t.nbytes();
      call.dtype = dtype;
      call.op = engineOp(op);
      cuda_->blocksDirect(cop, *run, call, timeout_ms);
    } else {
      cuda_->allReduceDirect(cop, t, dtype, engineOp(op), timeout_ms);
    }
    finishAverage(t, op, size_);
    return true;
  };
#else
  (void)t, (void)dtype, (void)op, (void)timeout_ms;
  return nullptr;
#endif
}

ProcessGroupTilecomm::Direct ProcessGroupTilecomm::directAllGather(const at::Tensor& in, std::vector<void*> outs,
                                                                 bool one_range, int64_t timeout_ms) {
#ifdef TILECOMM_WITH_CUDA
  if (!cuda_ || !in.is_cuda()) return nullptr;
  // Note [Registered tensors]: outputs registered in place first (large calls), then NVSHMEM's kernels
  // or LL (NVSHMEM's are offered only above the LL limit); every answer is the same on every rank.
  const bool registered = cuda_->allGatherRegisterEligible(in.nbytes(), one_range);
  const auto blocks = cuda_->allGatherBlocks(in.nbytes());
  const bool ll = cuda_->allGatherLL(in.nbytes());
  if (!registered && !blocks && !ll) return nullptr;
  cuda::BlockCall call;
  call.in[0] = in.data_ptr();
  for (int q = 0; q < size_; ++q) call.out[q] = outs[q];
  call.nbytes = in.nbytes();
  return [this, in, outs = std::move(outs), registered, blocks, ll, call, timeout_ms](CudaOp& cop) {
    if (registered && cuda_->allGatherRegistered(cop, in, outs, timeout_ms)) return true;
    if (blocks) {
      auto run = cuda_->nvshmemReady(cop, *blocks);
      if (!run) return false;
      cuda_->blocksDirect(cop, *run, call, timeout_ms);
      return true;
    }
    if (!ll || !cuda_->directReady(cop)) return false;
    cuda_->allGatherDirect(cop, in, outs, timeout_ms);
    return true;
  };
#else
  (void)in, (void)outs, (void)one_range, (void)timeout_ms;
  return nullptr;
#endif
}

ProcessGroupTilecomm::Direct ProcessGroupTilecomm::directReduceScatter(std::vector<at::Tensor> ins, bool contiguous,
                                                                     const at::Tensor& out, DType dtype,
                                                                     const c10d::ReduceOp& op, int64_t timeout_ms) {
#ifdef TILECOMM_WITH_CUDA
  if (!cuda_ || !out.is_cuda()) return nullptr;
  auto algo = cuda_->reduceScatterBlocks(out.nbytes(), dtype, engineOp(op));
  if (!algo) return nullptr;
  return [this, ins = std::move(ins), contiguous, out = at::Tensor(out), dtype, op, algo = *algo,
          timeout_ms](CudaOp& cop) mutable {
    auto run = cuda_->nvshmemReady(cop, algo);  // the same answer on every rank
    if (!run) return false;
    std::vector<at::Tensor> src = ins;
    if (op.op_ == c10d::ReduceOp::PREMUL_SUM) {  // scaled copies (operation's stream), never the input
      for (at::Tensor& t : src) {
        t = t.clone();
        premultiply(t, op);
      }
    }
    cuda::BlockCall call;
    call.nbytes = out.nbytes();
    call.dtype = dtype;
    call.op = engineOp(op);
    call.in_contiguous = contiguous;
    for (int q = 0; q < size_; ++q)
      call.in[q] = contiguous ? static_cast<const char*>(src[0].data_ptr()) + q * call.nbytes : src[q].data_ptr();
    call.out[0] = out.data_ptr();
    cuda_->blocksDirect(cop, *run, call, timeout_ms);
    finishAverage(out, op, size_);
    return true;
  };
#else
  (void)ins, (void)contiguous, (void)out, (void)dtype, (void)op, (void)timeout_ms;
  return nullptr;
#endif
}

ProcessGroupTilecomm::Direct ProcessGroupTilecomm::directAllToAll(std::vector<at::Tensor> ins,
                                                                std::vector<size_t> in_off,
                                                                std::vector<size_t> in_len,
                                                                std::vector<at::Tensor> outs,
                                                                std::vector<size_t> out_off,
                                                                std::vector<size_t> out_len, bool equal,
                                                                DType dtype, int64_t timeout_ms) {
#ifdef TILECOMM_WITH_CUDA
  // NOTE: decided at issue, so that a call that would be staged is refused under capture (launch).
  if (!cuda_ || outs.empty() || !outs[0].is_cuda() || !cuda_->allToAllEligible()) return nullptr;
  return [=](CudaOp& cop) {
    auto begin = [](const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); };
    bool overlap = false;  // the kernel reads the inputs while it writes the outputs
    for (const at::Tensor& i : ins)
      for (const at::Tensor& o : outs)
        overlap |= i.nbytes() > 0 && o.nbytes() > 0 && begin(i) < begin(o) + o.nbytes() &&
                   begin(o) < begin(i) + i.nbytes();
    std::vector<at::Tensor> src = ins;
    if (overlap)
      for (at::Tensor& t : src) t = t.clone();  // on the operation's stream
    cuda::AllToAllCall call{};
    for (int q = 0; q < size_; ++q) {  // one tensor of every block, or a tensor per block
      call.in[q] = begin(src[src.size() == 1 ? 0 : q]) + in_off[q];
      call.in_bytes[q] = in_len[q];
      call.out[q] = begin(outs[outs.size() == 1 ? 0 : q]) + out_off[q];
      call.out_bytes[q] = out_len[q];
    }
    return cuda_->allToAll(cop, call, equal, dtype, timeout_ms);
  };
#else
  (void)ins, (void)in_off, (void)in_len, (void)outs, (void)out_off, (void)out_len, (void)equal, (void)dtype,
      (void)timeout_ms;
  return nullptr;
#endif
}

std::string ProcessGroupTilecomm::cudaStatus() const {
#ifdef TILECOMM_WITH_CUDA
  return cuda_ ? cuda_->status() : "";
#else
  return "";
#endif
}

#ifdef TILECOMM_WITH_CUDA
GpuTopology ProcessGroupTilecomm::cudaTopology() const { return cuda_ ? cuda_->topology() : GpuTopology{}; }

std::string ProcessGroupTilecomm::cudaLastKernel() const { return cuda_ ? cuda_->lastKernel() : ""; }

at::Tensor ProcessGroupTilecomm::symmetricEmpty(const std::vector<int64_t>& sizes, at::ScalarType dtype,
                                               const c10::Device& device) {
  TORCH_CHECK_VALUE(cuda_, "tilecomm: this process group was created without CUDA support");
  TORCH_CHECK_VALUE(device.is_cuda(), "tilecomm: symmetric memory is on CUDA devices; got ", device);
  uint64_t nbytes = c10::elementSize(dtype);
  for (int64_t d : sizes) {
    TORCH_CHECK_VALUE(d >= 0, "tilecomm: symmetric_empty got a negative size ", d);
    TORCH_CHECK_VALUE(!__builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes),
                      "tilecomm: symmetric_empty: the size overflows");
  }
  void* p = nullptr;
  std::exception_ptr err;
  exec::Engine::Task task;  // in issue order: every rank makes the collective allocations in one order
  task.run = [&] {
    // NOTE: every exception is caught here: one escaping a task would stop the group's issue order.
    try {
      const std::string failed = engine_->failure();  // a dead peer would never reach the collective
      if (!failed.empty()) std::rethrow_exception(failedGroup(failed));
      p = cuda_->symmetricAlloc(nbytes, device);
    } catch (const Error& e) {
      err = toException(e);
    } catch (...) {
      err = std::current_exception();
    }
  };
  task.done = [] {};
  engine_->runNow(std::move(task));
  if (err) std::rethrow_exception(err);
  // NOTE: never freed (Note [NVSHMEM lifetime]): a free is collective, tensors die at different times.
  return at::from_blob(p, sizes, [](void*) {}, at::TensorOptions().dtype(dtype).device(device));
}

PeerWatch ProcessGroupTilecomm::peerWatch() const {
  std::weak_ptr<exec::Engine> weak = engine_;
  return [weak] {
    std::vector<std::pair<int, std::string>> dead;
    auto e = weak.lock();
    if (!e) return dead;
    transport::Transport& tr = e->transport();
    for (int r = 0; r < e->world(); ++r)
      if (r != e->rank() && tr.link(r) == transport::Link::kShm && tr.shm().peerDead(r))
        dead.emplace_back(r, tr.deathNote(r));
    return dead;
  };
}
#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  host_stages::mark(host_stages::Stage::kEnter);  // Note [Host stages]
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].layout() == at::kSparse)
    return allreduceSparse(tensors[0], opts);
  at::Tensor t = single(tensors, "all_reduce");
  DType dtype = checkReduction(t, opts.reduceOp);
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  auto op = opts.reduceOp;
  Direct direct = t.is_cuda() ? directAllReduce(t, dtype, op, timeout) : nullptr;
  host_stages::mark(host_stages::Stage::kChecked);
  return launch(c10d::OpType::ALLREDUCE, opts.asyncOp, {t}, {t}, {t}, [=](const Host& h) {
    at::Tensor x = h(t);
    reduceOver(h, Coll::kAllReduce, x, op, -1, x.numel(), timeout);
    finishAverage(x, op, size_);
  }, std::move(direct), onDevice(Coll::kAllReduce, t, engineOp(op)));
}

// Note [Sparse all_reduce]
// DDP with sparse gradients (nn.Embedding(sparse=True)) all_reduces sparse COO tensors, which Gloo
// supports for SUM. Four all_gathers on the engine: each rank's dims, sparse_dim, dtype and nnz,
// then its sizes (so that a rank whose tensor differs fails on every rank alike, naming it), then
// the indices and the values, each padded to the largest nnz. Every rank concatenates the blocks
// in rank order and coalesces (which sums duplicate indices), so all end with the same coalesced
// tensor, copied into t (its nnz changes) and the Work's result.
c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::allreduceSparse(at::Tensor& t,
                                                                   const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(t.is_cpu(), "tilecomm: all_reduce of sparse tensors runs on CPU tensors; got one on ",
                    t.device());
  TORCH_CHECK_VALUE(opts.reduceOp.op_ == c10d::ReduceOp::SUM,
                    "tilecomm: all_reduce of sparse tensors supports only ReduceOp.SUM (as Gloo)");
  TORCH_CHECK_TYPE(toDType(t.scalar_type()).has_value(), "tilecomm: cannot reduce tensors of dtype ",
                   t.scalar_type());
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  return launch(c10d::OpType::ALLREDUCE, opts.asyncOp, {t}, {t}, {t}, [=](const Host& h) {
    at::Tensor x = t.coalesce();
    constexpr int64_t kHead = 4;
    at::Tensor head = at::empty({size_ * kHead}, at::kLong);
    at::Tensor mine = head.narrow(0, rank_ * kHead, kHead);
    mine[0] = x.dim();
    mine[1] = x.sparse_dim();
    mine[2] = static_cast<int64_t>(x.scalar_type());
    mine[3] = x._nnz();
    move(h, Coll::kAllGather, head, -1, kHead, timeout);
    auto m = head.accessor<int64_t, 1>();
    auto differs = [&](int r, const char* what) {
      C10_THROW_ERROR(ValueError, c10::str("tilecomm: all_reduce of sparse tensors: rank ", r, "'s tensor has another ",
                                           what, " than rank ", rank_, "'s"));
    };
    int64_t most = 0;
    for (int r = 0; r < size_; ++r) {
      for (int64_t k = 0; k < 3; ++k)
        if (m[r * kHead + k] != m[rank_ * kHead + k]) differs(r, k == 2 ? "dtype" : "shape or sparse_dim");
      most = std::max(most, m[r * kHead + 3]);
    }
    const int64_t dims = x.dim();
    at::Tensor sizes = at::empty({size_ * dims}, at::kLong);
    for (int64_t d = 0; d < dims; ++d) sizes[rank_ * dims + d] = x.size(d);
    move(h, Coll::kAllGather, sizes, -1, dims, timeout);
    auto sz = sizes.accessor<int64_t, 1>();
    for (int r = 0; r < size_; ++r)
      for (int64_t d = 0; d < dims; ++d)
        if (sz[r * dims + d] != sz[rank_ * dims + d]) differs(r, "shape or sparse_dim");
    at::Tensor idx = x._indices(), val = x._values();
    const int64_t sd = idx.size(0);
    int64_t row = 1;  // elements of one value (the dense dimensions)
    for (int64_t d = 1; d < val.dim(); ++d) row *= val.size(d);
    at::Tensor idx_all = at::zeros({size_, sd, most}, idx.options());
    at::Tensor val_all = at::zeros({size_ * most * row}, val.options());
    idx_all[rank_].narrow(1, 0, idx.size(1)).copy_(idx);
    val_all.narrow(0, rank_ * most * row, val.numel()).copy_(val.reshape({-1}));
    at::Tensor idx_flat = idx_all.view({-1});
    move(h, Coll::kAllGather, idx_flat, -1, sd * most, timeout);
    move(h, Coll::kAllGather, val_all, -1, most * row, timeout);
    std::vector<at::Tensor> idxs, vals;
    std::vector<int64_t> val_shape = val.sizes().vec();
    for (int r = 0; r < size_; ++r) {
      const int64_t nnz = m[r * kHead + 3];
      idxs.push_back(idx_all[r].narrow(1, 0, nnz));
      val_shape[0] = nnz;
      vals.push_back(val_all.narrow(0, r * most * row, nnz * row).view(val_shape));
    }
    at::Tensor sum = at::sparse_coo_tensor(at::cat(idxs, 1), at::cat(vals), x.sizes(), x.options()).coalesce();
    t.copy_(sum);
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
  return launch(c10d::OpType::ALLREDUCE_COALESCED, opts.asyncOp, ts, ts, ts, [=](const Host& h) {
    std::vector<at::Tensor> flat;
    for (auto& t : ts) flat.push_back(h(t).reshape({-1}));
    at::Tensor buf = at::cat(flat);
    reduceOver(h, Coll::kAllReduce, buf, op, -1, buf.numel(), timeout);
    finishAverage(buf, op, size_);
    int64_t off = 0;
    for (auto& t : ts) {
      h(t).view({-1}).copy_(buf.narrow(0, off, t.numel()));
      off += t.numel();
    }
  }, nullptr, onDevice(Coll::kAllReduce, ts[0], engineOp(op)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  at::Tensor t = single(tensors, "broadcast");
  int root = static_cast<int>(opts.rootRank);
  checkRank(root, size_, "root");
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  std::vector<at::Tensor> writes;
  if (rank_ != root) writes.push_back(t);  // the root's tensor is only read
  return launch(c10d::OpType::BROADCAST, opts.asyncOp, {t}, {t}, writes, [=](const Host& h) {
    at::Tensor x = h(t);
    move(h, Coll::kBroadcast, x, root, x.numel(), timeout);
  }, nullptr, onDevice(Coll::kBroadcast, t, RedOp::kNone));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  at::Tensor t = single(tensors, "reduce");
  checkReduction(t, opts.reduceOp);
  int root = static_cast<int>(opts.rootRank);
  checkRank(root, size_, "root");
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  auto op = opts.reduceOp;
  std::vector<at::Tensor> writes;
  if (rank_ == root) writes.push_back(t);
  return launch(c10d::OpType::REDUCE, opts.asyncOp, {t}, {t}, writes, [=](const Host& h) {
    // Only the root's tensor changes; other ranks reduce in a scratch copy.
    at::Tensor x = h(t);
    at::Tensor buf = rank_ == root ? x : x.clone();
    reduceOver(h, Coll::kReduce, buf, op, root, t.numel(), timeout);
    if (rank_ == root) finishAverage(x, op, size_);
  }, nullptr, onDevice(Coll::kReduce, t, engineOp(op)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  host_stages::mark(host_stages::Stage::kEnter);  // Note [Host stages]
  checkTensor(input, "all_gather input");
  checkTensor(output, "all_gather output");
  checkDevice(input, output, "all_gather output");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "tilecomm: all_gather output has dtype ",
                   output.scalar_type(), " but the input has ", input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "tilecomm: all_gather output has ", output.numel(),
                    " elements; expected world size (", size_, ") x input (", input.numel(), ")");
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  at::Tensor in = input, out = output;
  // The kernels' view of the output: one block per rank. NOTE: addresses, not narrowed views:
  // the views would cost a few microseconds each per call, and the Work keeps `out` alive.
  std::vector<void*> blocks;
  for (int r = 0; in.is_cuda() && r < size_; ++r)
    blocks.push_back(static_cast<char*>(out.data_ptr()) + r * in.nbytes());
  Direct direct = directAllGather(in, std::move(blocks), true, timeout);
  host_stages::mark(host_stages::Stage::kChecked);
  return launch(c10d::OpType::_ALLGATHER_BASE, opts.asyncOp, {out}, {in}, {out}, [=](const Host& h) {
    at::Tensor flat = h(out).view({-1});
    flat.narrow(0, rank_ * in.numel(), in.numel()).copy_(h(in).view({-1}));
    move(h, Coll::kAllGather, flat, -1, in.numel(), timeout);
  }, std::move(direct), onDevice(Coll::kAllGather, in, RedOp::kNone));
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
  std::vector<void*> blocks;
  for (size_t r = 0; in.is_cuda() && r < outs.size(); ++r) blocks.push_back(outs[r].data_ptr());
  Direct direct = directAllGather(in, std::move(blocks), false, timeout);
  return launch(c10d::OpType::ALLGATHER, opts.asyncOp, outs, {in}, outs, [=](const Host& h) {
    at::Tensor x = h(in);
    at::Tensor buf = at::empty({size_ * in.numel()}, x.options());
    buf.narrow(0, rank_ * in.numel(), in.numel()).copy_(x.view({-1}));
    move(h, Coll::kAllGather, buf, -1, in.numel(), timeout);
    for (int r = 0; r < size_; ++r) h(outs[r]).view({-1}).copy_(buf.narrow(0, r * in.numel(), in.numel()));
  }, std::move(direct), onDevice(Coll::kAllGather, in, RedOp::kNone));
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
  return launch(c10d::OpType::ALLGATHER_COALESCED, opts.asyncOp, all_out, {}, {}, [works](const Host&) {
    for (auto& w : works) w->wait();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "tilecomm: all_gather_into_tensor_coalesced has ",
                    inputs.size(), " inputs but ", outputs.size(), " outputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_allgather_base(outputs[i], inputs[i], opts));
  return launch(c10d::OpType::COALESCED, opts.asyncOp, outputs, {}, {}, [works](const Host&) {
    for (auto& w : works) w->wait();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  checkTensor(input, "reduce_scatter input");
  checkTensor(output, "reduce_scatter output");
  checkDevice(input, output, "reduce_scatter output");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "tilecomm: reduce_scatter output has dtype ",
                   output.scalar_type(), " but the input has ", input.scalar_type());
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "tilecomm: reduce_scatter input has ", input.numel(),
                    " elements; expected world size (", size_, ") x output (", output.numel(), ")");
  DType dtype = checkReduction(input, opts.reduceOp);
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  auto op = opts.reduceOp;
  at::Tensor in = input, out = output;
  Direct direct = in.is_cuda() ? directReduceScatter({in}, true, out, dtype, op, timeout) : nullptr;
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, opts.asyncOp, {out}, {in}, {out}, [=](const Host& h) {
    at::Tensor buf = h(in).reshape({-1}).clone();
    reduceOver(h, Coll::kReduceScatter, buf, op, -1, out.numel(), timeout);
    at::Tensor o = h(out);
    o.view({-1}).copy_(buf.narrow(0, rank_ * out.numel(), out.numel()));
    finishAverage(o, op, size_);
  }, std::move(direct), onDevice(Coll::kReduceScatter, out, engineOp(op)));
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
  DType dtype = checkReduction(out, opts.reduceOp);
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  auto op = opts.reduceOp;
  Direct direct = out.is_cuda() ? directReduceScatter(ins, false, out, dtype, op, timeout) : nullptr;
  return launch(c10d::OpType::REDUCE_SCATTER, opts.asyncOp, {out}, ins, {out}, [=](const Host& h) {
    std::vector<at::Tensor> flat;
    for (auto& t : ins) flat.push_back(h(t).reshape({-1}));
    at::Tensor buf = at::cat(flat);
    reduceOver(h, Coll::kReduceScatter, buf, op, -1, out.numel(), timeout);
    at::Tensor o = h(out);
    o.view({-1}).copy_(buf.narrow(0, rank_ * out.numel(), out.numel()));
    finishAverage(o, op, size_);
  }, std::move(direct), onDevice(Coll::kReduceScatter, out, engineOp(op)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "tilecomm: reduce_scatter_tensor_coalesced has ",
                    inputs.size(), " inputs but ", outputs.size(), " outputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  return launch(kReduceScatterTensorCoalesced, opts.asyncOp, outputs, {}, {}, [works](const Host&) {
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
  return launch(c10d::OpType::GATHER, opts.asyncOp, outs, {in}, outs, [=](const Host& h) {
    // The schedule's buffer holds blocks in order of rank relative to the root.
    int64_t n = in.numel();
    int v = (rank_ - root + size_) % size_;
    at::Tensor x = h(in);
    at::Tensor buf = at::empty({size_ * n}, x.options());
    buf.narrow(0, v * n, n).copy_(x.view({-1}));
    move(h, Coll::kGather, buf, root, n, timeout);
    if (rank_ == root)
      for (int u = 0; u < size_; ++u) h(outs[(u + root) % size_]).view({-1}).copy_(buf.narrow(0, u * n, n));
  }, nullptr, onDevice(Coll::kGather, in, RedOp::kNone));
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
  return launch(c10d::OpType::SCATTER, opts.asyncOp, {out}, ins, {out}, [=](const Host& h) {
    int64_t n = out.numel();
    int v = (rank_ - root + size_) % size_;
    at::Tensor o = h(out);
    at::Tensor buf = at::empty({size_ * n}, o.options());
    if (rank_ == root)
      for (int u = 0; u < size_; ++u) buf.narrow(0, u * n, n).copy_(h(ins[(u + root) % size_]).view({-1}));
    move(h, Coll::kScatter, buf, root, n, timeout);
    o.view({-1}).copy_(buf.narrow(0, v * n, n));
  }, nullptr, onDevice(Coll::kScatter, out, RedOp::kNone));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions& opts) {
  checkTensor(input, "all_to_all input");
  checkTensor(output, "all_to_all output");
  checkDevice(input, output, "all_to_all output");
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
  TORCH_CHECK_VALUE(in_len[rank_] == out_len[rank_], "tilecomm: all_to_all on rank ", rank_, " sends itself ",
                    in_len[rank_], " bytes (its input split) but expects ", out_len[rank_],
                    " (its output split); the two must be equal");
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  // Equal splits on every rank: the total size agrees across ranks and picks the
  // algorithm. Uneven splits: sizes differ per rank, so all use the largest-size choice.
  bool equal = input_splits.empty() && output_splits.empty();
  uint64_t total = equal ? input.nbytes() : 0;
  uint16_t algo = engine_->pick(Coll::kAllToAll, equal ? total : UINT64_MAX);
  // Every block of one size, given as splits or not (TILECOMM_CUDA_ALLTOALL=registered).
  const bool same_blocks = std::all_of(in_len.begin(), in_len.end(), [&](size_t l) { return l == in_len[0]; }) &&
                           std::all_of(out_len.begin(), out_len.end(), [&](size_t l) { return l == in_len[0]; });
  at::Tensor in = input, out = output;
  DType dt = toDType(input.scalar_type()).value_or(DType::kBytes);  // ranks must agree on it too
  return launch(c10d::OpType::ALLTOALL_BASE, opts.asyncOp, {out}, {in}, {out}, [=](const Host& h) {
    engine_->allToAll(algo, bytes(h(in)), in_off, in_len, bytes(h(out)), out_off, out_len, dt, total, timeout);
  }, directAllToAll({in}, in_off, in_len, {out}, out_off, out_len, same_blocks, dt, timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
                    "tilecomm: all_to_all needs world size (", size_, ") input and output tensors, got ",
                    inputs.size(), " and ", outputs.size());
  for (int r = 0; r < size_; ++r) {
    checkSame(inputs[0], inputs[r], "all_to_all input", r, false);
    checkSame(inputs[0], outputs[r], "all_to_all output", r, false);
  }
  TORCH_CHECK_VALUE(inputs[rank_].nbytes() == outputs[rank_].nbytes(), "tilecomm: all_to_all on rank ", rank_,
                    " sends itself ", inputs[rank_].nbytes(), " bytes (input[", rank_, "]) but expects ",
                    outputs[rank_].nbytes(), " (output[", rank_, "]); the two must be equal");
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  // Block sizes may differ per rank, so every rank uses the largest-size choice.
  uint16_t algo = engine_->pick(Coll::kAllToAll, UINT64_MAX);
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  DType dt = toDType(inputs[0].scalar_type()).value_or(DType::kBytes);
  std::vector<size_t> in_len, out_len;  // each peer's block is its own tensor
  for (int r = 0; r < size_; ++r) {
    in_len.push_back(ins[r].nbytes());
    out_len.push_back(outs[r].nbytes());
  }
  return launch(c10d::OpType::ALLTOALL, opts.asyncOp, outs, ins, outs, [=](const Host& h) {
    // Offsets from address zero.
    std::vector<size_t> in_off, out_off;
    for (int r = 0; r < size_; ++r) {
      in_off.push_back(reinterpret_cast<size_t>(h(ins[r]).data_ptr()));
      out_off.push_back(reinterpret_cast<size_t>(h(outs[r]).data_ptr()));
    }
    engine_->allToAll(algo, nullptr, in_off, in_len, nullptr, out_off, out_len, dt, 0, timeout);
  }, directAllToAll(ins, std::vector<size_t>(size_), in_len, outs, std::vector<size_t>(size_), out_len, false, dt,
                    timeout));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::barrier(const c10d::BarrierOptions& opts) {
  int64_t timeout = timeoutOf(opts.timeout, timeout_ms_);
  return launch(c10d::OpType::BARRIER, opts.asyncOp, {}, {}, {}, [=](const Host&) {
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
  TORCH_CHECK_VALUE(t.is_contiguous(), "tilecomm: ", type == c10d::OpType::SEND ? "send" : "recv",
                    " needs a contiguous tensor (call .contiguous() first)");
  if (type != c10d::OpType::RECVANYSOURCE) {
    checkRank(peer, size_, "peer rank");
    TORCH_CHECK_VALUE(peer != rank_, "tilecomm: rank ", rank_, " cannot send to or receive from itself");
  }
  std::shared_ptr<CudaOp> cop;
  at::Tensor host = t;  // the bytes the engine moves
#ifdef TILECOMM_WITH_CUDA
  if (t.is_cuda()) {  // staged through pinned memory (Note [CUDA streams])
    TORCH_CHECK_VALUE(cuda_, "tilecomm: this process group was created without CUDA support");
    const bool direct = cuda_->p2pDirect();
    cop = direct ? cuda_->beginP2P(t.device()) : cuda_->begin(t.device());
    TORCH_CHECK_VALUE(!cop->captured, "tilecomm: ", c10d::opTypeToString(type),
                      " on CUDA tensors cannot be captured in a CUDA graph: point-to-point runs through the host");
    if (direct) {
      if (type == c10d::OpType::SEND) return sendDirect(t, peer, tag, std::move(cop));
      return recvDirect(type, t, peer, tag, std::move(cop));
    }
    host = type == c10d::OpType::SEND ? copyToHost(*cop, t) : pinnedLike(t);
  }
#endif
  auto work = c10::make_intrusive<TilecommWork>(rank_, type, std::vector<at::Tensor>{t},
                                                std::vector<at::Tensor>{t, host}, cop);
  std::string failed = engine_->failure();
  if (!failed.empty()) {
    work->complete(failedGroup(failed));
    return work;
  }
  exec::P2POp op;
  op.send = type == c10d::OpType::SEND;
  op.peer = peer;
  op.tag = tag;
  op.ptr = bytes(host);
  op.nbytes = t.nbytes();
  op.timeout_ms = timeout_ms_;
#ifdef TILECOMM_WITH_CUDA
  op.done = op.send || !cop ? p2pDone(work) : landOnGpu(work, cop, t, host);
#else
  op.done = p2pDone(work);
#endif
  engine_->p2p().post(std::move(op));
  return work;
}

#ifdef TILECOMM_WITH_CUDA
c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::sendDirect(const at::Tensor& t, int dst, int tag,
                                                              std::shared_ptr<CudaOp> cop) {
  auto work = c10::make_intrusive<TilecommWork>(rank_, c10d::OpType::SEND, std::vector<at::Tensor>{t},
                                                std::vector<at::Tensor>{t}, cop);
  std::string failed = engine_->failure();
  if (!failed.empty()) {
    work->complete(failedGroup(failed));
    return work;
  }
  auto desc = std::make_shared<P2PDesc>(cuda_->p2pExport(*cop, t, dst));  // waits until t is written
  const uint64_t n = t.nbytes();
  const int64_t timeout = timeout_ms_;
  const std::string label = "CUDA send to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ", " +
                            std::to_string(n) + " bytes)";
  // Callbacks run on the point-to-point thread, which stops before the group's members go
  // (~ProcessGroupTilecomm): plain pointers to them hold there.
  exec::Engine* engine = engine_.get();
  CudaGroup* cuda = cuda_.get();
  // The Work completes once: on the reply (exported), or once the bytes are sent through host
  // memory, or with the first failure. An exported send that times out fails the group and keeps
  // t until the group's end: its receiver could still copy it.
  auto once = std::make_shared<std::atomic<bool>>(false);
  const bool exported = desc->exported != 0;
  const at::Tensor host = exported ? at::Tensor() : copyToHost(*cop, t);  // before any message goes
  auto finish = [work, once, dst, engine, cuda, t, exported](std::exception_ptr e, const std::string& err = "") {
    if (once->exchange(true)) return;
    if (exported && err.rfind("timed out", 0) == 0) {
      cuda->p2pKeep(t);
      engine->fail(err, true);
    }
    work->complete(std::move(e), dst);
  };
  if (exported) {
    auto reply = std::make_shared<P2PReply>();
    engine->p2p().post(p2pMessage(
        false, dst, p2pReplyTag(desc->seq), reply.get(), sizeof(P2PReply), timeout, label,
        [finish, reply, dst, n, rank = rank_](int, const std::string& err) {
          if (!err.empty()) return finish(p2pException(err), err);
          if (reply->code == P2PReply::kCopied) return finish(nullptr);
          if (reply->code == P2PReply::kSizeMismatch)
            return finish(toException(Error(ErrorKind::kInvalid, "rank " + std::to_string(rank) + " sent " +
                                                                     std::to_string(n) + " bytes to rank " +
                                                                     std::to_string(dst) + " but the receive posted " +
                                                                     std::to_string(reply->posted) + " bytes")));
          finish(toException(Error(ErrorKind::kPeerFailed, "rank " + std::to_string(dst) +
                                                               " could not copy this CUDA send from rank " +
                                                               std::to_string(rank) + "'s memory (its error says "
                                                               "why; TILECOMM_CUDA_P2P=staged sends through host "
                                                               "memory)")));
        }));
  }
  engine->p2p().post(p2pMessage(true, dst, p2pDescTag(tag), desc.get(), sizeof(P2PDesc), timeout, label,
                                [desc, finish](int, const std::string& err) {
                                  if (!err.empty()) finish(p2pException(err), err);
                                }));
  if (!exported) {  // the bytes follow through pinned host memory, as when staged
    engine->p2p().post(p2pMessage(true, dst, p2pDataTag(desc->seq), host.data_ptr(), n, timeout, label,
                                  [finish, host](int, const std::string& err) {
                                    finish(err.empty() ? nullptr : p2pException(err), err);
                                  }));
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTilecomm::recvDirect(c10d::OpType type, const at::Tensor& t, int src,
                                                              int tag, std::shared_ptr<CudaOp> cop) {
  auto work = c10::make_intrusive<TilecommWork>(rank_, type, std::vector<at::Tensor>{t}, std::vector<at::Tensor>{t},
                                                cop);
  std::string failed = engine_->failure();
  if (!failed.empty()) {
    work->complete(failedGroup(failed));
    return work;
  }
  auto desc = std::make_shared<P2PDesc>();
  const int64_t timeout = timeout_ms_;
  const std::string label = "CUDA recv from " + (src >= 0 ? "rank " + std::to_string(src) : std::string("any rank")) +
                            " (tag " + std::to_string(tag) + ", " + std::to_string(t.nbytes()) + " bytes)";
  // Plain pointers: see sendDirect.
  exec::Engine* engine = engine_.get();
  CudaGroup* cuda = cuda_.get();
  auto on_desc = [=](int from, const std::string& err) {
    if (!err.empty()) return work->complete(p2pException(err), from);
    const uint64_t n = t.nbytes();
    if (desc->magic != P2PDesc::kMagic) {  // the channel is out of step: nothing more can be trusted
      const std::string why = "malformed CUDA point-to-point message from rank " + std::to_string(from);
      engine->fail(why, true);
      return work->complete(toException(Error(ErrorKind::kDesync, why)), from);
    }
    if (desc->nbytes != n) {
      if (desc->exported) {
        cuda->p2pReply(from, desc->seq, P2PReply{P2PReply::kSizeMismatch, static_cast<int64_t>(n)}, timeout);
      } else {  // take the bytes that follow, so that they are not kept aside
        auto sink = std::make_shared<std::vector<char>>(desc->nbytes);
        engine->p2p().post(p2pMessage(false, from, p2pDataTag(desc->seq), sink->data(), sink->size(), timeout, label,
                                      [sink](int, const std::string&) {}));
      }
      return work->complete(toException(Error(ErrorKind::kInvalid, "rank " + std::to_string(from) + " sent " +
                                                                       std::to_string(desc->nbytes) + " bytes with tag " +
                                                                       std::to_string(tag) + " but the receive posted " +
                                                                       std::to_string(n) + " bytes")),
                            from);
    }
    if (!desc->exported) {  // the bytes follow through pinned host memory, then to t on the p2p stream
      at::Tensor host = pinnedLike(t);
      engine->p2p().post(p2pMessage(false, from, p2pDataTag(desc->seq), host.data_ptr(), n, timeout, label,
                                    landOnGpu(work, cop, t, host)));
      return;
    }
    // A sender that failed the group (its send timed out) may have its tensor back by now.
    std::string gone = engine->failure();
    if (gone.empty()) gone = engine->peerFailure();
    if (!gone.empty()) return work->complete(failedGroup(gone), from);
    try {
      cuda->p2pCopy(*cop, t, from, *desc, timeout);
    } catch (const Error& e) {  // nothing else replies: the sender would wait until its timeout
      cuda->p2pReply(from, desc->seq, P2PReply{P2PReply::kFailed, 0}, timeout);
      throw Error(e.kind(), std::string(e.what()) + " (GPU-to-GPU send and recv need peer access between the "
                                                    "GPUs; TILECOMM_CUDA_P2P=staged sends through host memory)");
    } catch (...) {
      cuda->p2pReply(from, desc->seq, P2PReply{P2PReply::kFailed, 0}, timeout);
      throw;
    }
    work->complete(nullptr, from);
  };
  engine_->p2p().post(p2pMessage(false, src, p2pDescTag(tag), desc.get(), sizeof(P2PDesc), timeout, label,
                                 [work, desc, on_desc](int from, const std::string& err) {
                                   try {
                                     on_desc(from, err);
                                   } catch (const Error& e) {
                                     work->complete(toException(e), from);
                                   } catch (...) {
                                     work->complete(std::current_exception(), from);
                                   }
                                 }));
  return work;
}
#endif

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

#include "backend/cuda_glue.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "common/error.h"

namespace tilecomm::backend {

namespace {

std::vector<uint8_t> toBytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string fromBytes(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

at::Tensor pinnedLike(const at::Tensor& t) {
  return at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).pinned_memory(true));
}

}  // namespace

// ---------------------------------------------------------------- CudaOp

std::string CudaOp::directError() const {
  if (!ipc || direct_launch == 0) return "";
  uint64_t failed = ipc->failedLaunch();
  return failed != 0 && direct_launch >= failed ? ipc->errorText() : "";
}

void CudaOp::run(const std::vector<at::Tensor>& tensors, const std::function<void()>& fn) {
  c10::cuda::CUDAGuard device_guard(device);
  c10::cuda::CUDAStreamGuard stream_guard(stream);
  ready.block(stream);
  try {
    fn();
  } catch (...) {
    end.record(stream);
    throw;
  }
  for (const at::Tensor& t : tensors)
    if (t.is_cuda() && t.storage().data_ptr().get())
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
  end.record(stream);
}

// ---------------------------------------------------------------- CudaGroup

CudaGroup::CudaGroup(int rank, int world, c10::intrusive_ptr<c10d::Store> store, std::string prefix,
                     CudaSettings settings)
    : rank_(rank),
      world_(world),
      store_(std::move(store)),
      prefix_(std::move(prefix)),
      settings_(std::move(settings)) {}

CudaGroup::~CudaGroup() {
  if (!raw_stream_) return;
  // Errors are ignored: at process exit the runtime may already be gone. A direct kernel
  // still running ends by itself (its waits are bounded), before the buffers are freed.
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) return;
  cudaSetDevice(device_->index());
  cudaStreamSynchronize(raw_stream_);
  // NOTE: a peer may still be reading our staging buffers in its last direct kernel; wait
  // (bounded: a dead peer reads nothing) until each says it is done, then free them.
  if (ipc_) ipc_->drain(std::min<int64_t>(settings_.timeout_ms, 10000));
  ipc_.reset();
  cudaSetDevice(prev);
}

std::shared_ptr<CudaOp> CudaGroup::begin(const c10::Device& device) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!device_) {
      c10::cuda::CUDAGuard guard(device);
      // NOTE: a pool stream, never destroyed: tensors the group used keep a record of
      // it in the caching allocator and may be freed after the group is gone.
      stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index());
      raw_stream_ = stream_->stream();
      device_ = device;
    }
    TORCH_CHECK_VALUE(*device_ == device, "tilecomm: this process group runs its CUDA work on ", *device_,
                      "; got a tensor on ", device, " (use one device per process and group)");
  }
  auto op = std::make_shared<CudaOp>(device, *stream_);
  c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TORCH_CHECK(cudaStreamIsCapturing(current.stream(), &capture) == cudaSuccess, "tilecomm: cudaStreamIsCapturing");
  op->captured = capture != cudaStreamCaptureStatusNone;
  op->ready.record(current);  // Note [CUDA graphs]: under capture, forks the internal stream into it
  return op;
}

uint64_t CudaGroup::llLimit() const {
  if (settings_.proto == "simple" || settings_.ipc_bytes == 0) return 0;
  return settings_.proto == "ll" ? cuda::kLLMaxBytes : std::min(settings_.ll_bytes, cuda::kLLMaxBytes);
}

std::optional<cuda::DirectAlgo> CudaGroup::directFor(uint64_t nbytes, DType dtype, RedOp op) const {
  const std::string& a = settings_.allreduce;
  if (a == "staged" || nbytes == 0 || world_ > cuda::kMaxRanks || !cuda::directSupports(dtype, op))
    return std::nullopt;
  if (nbytes <= llLimit()) return cuda::DirectAlgo::kOneShotLL;
  if (settings_.ipc_bytes == 0) return std::nullopt;
  // Larger than the staging buffers: the kernel runs once per buffer-sized piece.
  if (a == "one_shot") return cuda::DirectAlgo::kOneShot;
  if (a == "two_shot") return cuda::DirectAlgo::kTwoShot;
  return nbytes < settings_.two_shot_bytes ? cuda::DirectAlgo::kOneShot : cuda::DirectAlgo::kTwoShot;
}

bool CudaGroup::allGatherLL(uint64_t nbytes) const {
  return nbytes > 0 && nbytes <= llLimit() && world_ <= cuda::kMaxRanks;
}

bool CudaGroup::directReady(const CudaOp& op) {
  if (op.captured && ipc_state_ == Ipc::kUnset)
    throw Error(ErrorKind::kInvalid,
                "the group's first direct CUDA collective cannot be captured in a CUDA graph (it sets up the "
                "cuda_ipc transport): run one all_reduce or all_gather on CUDA tensors before capturing");
  if (ipc_state_ == Ipc::kUnset) ipc_state_ = setUpIpc() ? Ipc::kOn : Ipc::kOff;
  if (op.captured && ipc_state_ != Ipc::kOn)
    throw Error(ErrorKind::kInvalid, "cannot capture this collective in a CUDA graph: the cuda_ipc transport is "
                                     "off (" + ipc_why_ + "), so it would be staged through host memory");
  return ipc_state_ == Ipc::kOn;
}

bool CudaGroup::setUpIpc() {
  // NOTE: every rank gets here in the same task (the first direct-eligible all_reduce,
  // Note [Issue order]), so the Store exchange cannot mismatch.
  std::string why, mine;
  try {
    ipc_ = std::make_shared<cuda::IpcTransport>(rank_, world_, device_->index(), settings_.ipc_bytes, llLimit(),
                                                raw_stream_);
    mine = ipc_->exportHandle();
  } catch (const std::exception& e) {
    why = e.what();
  }
  const std::string key = prefix_ + "cuda_ipc/";
  store_->set(key + "handle/" + std::to_string(rank_), toBytes(mine));
  std::vector<std::string> handles;
  for (int r = 0; r < world_; ++r) handles.push_back(fromBytes(store_->get(key + "handle/" + std::to_string(r))));
  if (why.empty()) why = ipc_->open(handles);
  store_->set(key + "ok/" + std::to_string(rank_), toBytes(why.empty() ? "ok" : why));
  for (int r = 0; r < world_; ++r) {
    std::string v = fromBytes(store_->get(key + "ok/" + std::to_string(r)));
    if (v != "ok" && ipc_why_.empty()) ipc_why_ = "rank " + std::to_string(r) + ": " + v;
  }
  if (!ipc_why_.empty()) {
    ipc_.reset();
    return false;
  }
  return true;
}

void CudaGroup::allReduceDirect(CudaOp& op, cuda::DirectAlgo algo, at::Tensor& t, DType dtype, RedOp rop,
                                int64_t timeout_ms) {
  uint64_t timeout_ns = static_cast<uint64_t>(timeout_ms) * 1000000ull;
  // Pieces of at most one staging buffer, cut at 256-byte boundaries (every dtype's
  // elements and the kernels' vector loads stay aligned); each is an all_reduce of its own.
  const uint64_t piece = algo == cuda::DirectAlgo::kOneShotLL ? t.nbytes() : ipc_->capacity() / 256 * 256;
  char* base = static_cast<char*>(t.data_ptr());
  for (uint64_t off = 0; off < t.nbytes(); off += piece) {
    op.direct_launch = cuda::allReduceDirect(algo, *ipc_, base + off, std::min(piece, t.nbytes() - off), dtype, rop,
                                             op.stream.stream(), timeout_ns);
  }
  op.ipc = ipc_;
}

void CudaGroup::allGatherDirect(CudaOp& op, const at::Tensor& in, const std::vector<at::Tensor>& outs,
                                int64_t timeout_ms) {
  std::vector<void*> out;
  for (const at::Tensor& t : outs) out.push_back(t.data_ptr());
  uint64_t timeout_ns = static_cast<uint64_t>(timeout_ms) * 1000000ull;
  op.direct_launch = cuda::allGatherDirectLL(*ipc_, in.data_ptr(), out.data(), in.nbytes(), op.stream.stream(),
                                             timeout_ns);
  op.ipc = ipc_;
}

void CudaGroup::runStaged(const std::vector<at::Tensor>& reads, const std::vector<at::Tensor>& writes,
                          const std::function<void(const Host&)>& body) {
  Host host;
  auto twin = [&](const at::Tensor& t, bool read) {
    if (!t.is_cuda() || host.has(t)) return;
    at::Tensor h = pinnedLike(t);
    if (read) h.copy_(t, /*non_blocking=*/true);
    host.add(t, h);
  };
  for (const at::Tensor& t : reads) twin(t, true);
  for (const at::Tensor& t : writes) twin(t, false);
  c10::cuda::getCurrentCUDAStream().synchronize();  // the internal stream: inputs are on the host now
  body(host);
  for (const at::Tensor& t : writes)
    if (t.is_cuda()) t.copy_(host(t), /*non_blocking=*/true);
}

std::string CudaGroup::failure() const {
  auto ipc = ipc_;
  return ipc ? ipc->errorText() : "";
}

std::string CudaGroup::status() const {
  // NOTE: plain strings, no iostreams: some toolchains link a private libstdc++ into the
  // extension, whose stream facets then clash with the process's locale.
  return "device=" + (device_ ? device_->str() : std::string("unbound")) + " allreduce=" + settings_.allreduce +
         " ipc_bytes=" + std::to_string(settings_.ipc_bytes) + " two_shot_bytes=" +
         std::to_string(settings_.two_shot_bytes) + " proto=" + settings_.proto + " ll_limit=" +
         std::to_string(llLimit()) + " direct=" +
         (ipc_state_ == Ipc::kOn ? "on" : ipc_state_ == Ipc::kOff ? "off (" + ipc_why_ + ")" : "unset");
}

// ---------------------------------------------------------------- point-to-point

at::Tensor copyToHost(CudaOp& op, const at::Tensor& t) {
  at::Tensor h = pinnedLike(t);
  op.run({t}, [&] { h.copy_(t, /*non_blocking=*/true); });
  op.stream.synchronize();
  return h;
}

void copyFromHost(CudaOp& op, const at::Tensor& t, const at::Tensor& host) {
  op.run({t}, [&] { t.copy_(host, /*non_blocking=*/true); });
}

}  // namespace tilecomm::backend

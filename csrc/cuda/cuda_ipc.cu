#include "cuda/cuda_ipc.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "common/error.h"

namespace tilecomm::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(ErrorKind::kSystem, std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

IpcTransport::IpcTransport(int rank, int world, int device, uint64_t capacity, uint64_t ll_capacity,
                           cudaStream_t stream)
    : rank_(rank),
      world_(world),
      device_(device),
      capacity_((capacity + 255) / 256 * 256),
      ll_capacity_((ll_capacity + 255) / 256 * 256) {
  if (world > kMaxRanks)
    throw Error(ErrorKind::kInvalid, "cuda_ipc supports groups of at most " + std::to_string(kMaxRanks) + " ranks");
  int prev = 0;
  check(cudaGetDevice(&prev), "cudaGetDevice");
  check(cudaSetDevice(device), "cudaSetDevice");
  try {
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    block_budget_ = std::max(1, std::min(kMaxBlocks, sms / world));
    const uint64_t bytes = kFlagBytes + 2 * capacity_ + 2 * static_cast<uint64_t>(world) * 2 * ll_capacity_;
    check(cudaMalloc(&own_, bytes), "cudaMalloc (cuda_ipc area)");
    // NOTE: zeroed once, here; flags, counter and LL lines are never reset afterwards (Note [Flags]).
    check(cudaMemsetAsync(own_, 0, bytes, stream), "cudaMemsetAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaHostAlloc(reinterpret_cast<void**>(&err_host_), sizeof(KernelError), cudaHostAllocMapped),
          "cudaHostAlloc (error record)");
    std::memset(err_host_, 0, sizeof(KernelError));
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&err_dev_), err_host_, 0), "cudaHostGetDevicePointer");
  } catch (...) {
    if (own_) cudaFree(own_);
    if (err_host_) cudaFreeHost(err_host_);
    cudaSetDevice(prev);
    throw;
  }
  peers_.base[rank] = own_;
  cudaSetDevice(prev);
}

IpcTransport::~IpcTransport() {
  // Errors are ignored: at process exit the runtime may already be gone.
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) return;
  cudaSetDevice(device_);
  for (char* p : opened_) cudaIpcCloseMemHandle(p);
  if (own_) cudaFree(own_);
  if (err_host_) cudaFreeHost(err_host_);
  cudaSetDevice(prev);
}

std::string IpcTransport::exportHandle() const {
  cudaIpcMemHandle_t h;
  check(cudaIpcGetMemHandle(&h, own_), "cudaIpcGetMemHandle");
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

std::string IpcTransport::open(const std::vector<std::string>& handles) {
  if (static_cast<int>(handles.size()) != world_) return "expected one handle per rank";
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device_) != cudaSuccess) return "cannot select the device";
  std::string why;
  for (int r = 0; r < world_ && why.empty(); ++r) {
    if (r == rank_) continue;
    if (handles[r].size() != sizeof(cudaIpcMemHandle_t)) {
      why = "rank " + std::to_string(r) + " published no cuda_ipc handle";
      break;
    }
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handles[r].data(), sizeof(h));
    void* p = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky; clear it
      why = "cudaIpcOpenMemHandle for rank " + std::to_string(r) + ": " + cudaGetErrorString(e);
      break;
    }
    opened_.push_back(static_cast<char*>(p));
    peers_.base[r] = static_cast<char*>(p);
  }
  cudaSetDevice(prev);
  return why;
}

void IpcTransport::drain(int64_t timeout_ms) {
  if (failedLaunch() != 0) return;
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device_) != cudaSuccess) return;
  auto seqOf = [](char* base, uint64_t& v) {
    return cudaMemcpy(&v, &counterOf(base)->seq, sizeof(v), cudaMemcpyDeviceToHost) == cudaSuccess;
  };
  uint64_t last = 0;
  if (seqOf(own_, last) && last > 0) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      uint64_t v = 0;
      while (seqOf(peers_.base[q], v) && v < last && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  cudaSetDevice(prev);
}

uint64_t IpcTransport::failedLaunch() const {
  const volatile KernelError* e = err_host_;
  return e->ready ? e->launch : 0;
}

std::string IpcTransport::errorText() const {
  const volatile KernelError* e = err_host_;
  if (!e->ready) return "";
  static const char* kKinds[] = {"direct all_reduce", "LL all_reduce", "LL all_gather"};
  const char* what = e->kind >= 0 && e->kind < 3 ? kKinds[e->kind] : "direct call";
  const std::string peer = std::to_string(e->peer);
  return "rank " + std::to_string(rank_) + " timed out on the GPU after " + std::to_string(e->waited_ns / 1000000) +
         " ms waiting for rank " + peer + " in " + what + " #" + std::to_string(e->seq) + " (cuda_ipc); rank " +
         peer + " did not arrive: it died, hangs, or called a different collective";
}

}  // namespace tilecomm::cuda

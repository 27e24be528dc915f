#include "cuda/peer_transport.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "common/error.h"
#include "cuda/cuda_ipc.h"
#include "cuda/nvshmem.h"

namespace tilecomm::cuda {

namespace {

// Note [Block budget]: the ranks' spinning kernels must all be resident at once, so the ranks
// sharing a GPU may take one block per SM of it between them, every kernel alike. The simple
// kernels' launch bounds would let two of their blocks share an SM, and for a while they
// launched twice the budget: the ranks' grids then needed nearly every block slot of the GPU
// (a 4 MiB two-shot at 8 ranks on one H200: 8 x 32 blocks for 264 slots), and with other small
// kernels of the ranks around the calls, blocks waited for peer blocks that never became
// resident (docs/benchmarks.md). At one block per SM half the slots stay free. Under MPS with
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = pct, the SM count a process sees is already its share
// (pct % of the GPU); the whole GPU is sms x 100 / pct, and world ranks may take that / world
// each, never more than their own share. Without the variable a process sees the whole GPU.
// Ranks whose shares differ (another percentage, another GPU model) get different budgets here;
// the group then takes the smallest (PeerTransport::agreeBudget), since a grid that differs
// between ranks would pair blocks that cover different vectors.
int blockBudgetFor(int sms, int world, const char* mps_percentage) {
  double pct = mps_percentage ? std::atof(mps_percentage) : 100.0;
  if (!(pct > 0.0 && pct <= 100.0)) pct = 100.0;
  const double whole = sms * 100.0 / pct;
  const int budget = static_cast<int>(std::min<double>(sms, whole / world));
  return std::max(1, std::min(kMaxBlocks, budget));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(ErrorKind::kSystem, std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

const char* peerMemoryName(PeerMemory m) {
  switch (m) {
    case PeerMemory::kHostMapped: return "host_mapped";
    case PeerMemory::kNvshmem: return "nvshmem";
    default: return "cuda_ipc";
  }
}

PeerTransport::PeerTransport(PeerMemory memory, int rank, int world, int device, uint64_t capacity,
                             uint64_t ll_capacity, cudaStream_t stream)
    : memory_(memory),
      rank_(rank),
      world_(world),
      device_(device),
      capacity_((capacity + 255) / 256 * 256),
      ll_capacity_((ll_capacity + 255) / 256 * 256),
      ll_end_(kFlagBytes + 2 * capacity_ + 2 * static_cast<uint64_t>(world) * 2 * ll_capacity_) {
  if (world > kMaxRanks)
    throw Error(ErrorKind::kInvalid, std::string(peerMemoryName(memory)) + " supports groups of at most " +
                                         std::to_string(kMaxRanks) + " ranks");
  int prev = 0;
  check(cudaGetDevice(&prev), "cudaGetDevice");
  check(cudaSetDevice(device), "cudaSetDevice");
  try {
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    block_budget_ = blockBudgetFor(sms, world, std::getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    const uint64_t bytes = areaBytes();
    // NOTE: zeroed once, here; flags, counter and LL lines are never reset afterwards (Note [Flags]).
    if (memory == PeerMemory::kHostMapped) {
      own_host_ = createHostArea(bytes);
      own_ = own_host_.device;
    } else if (memory == PeerMemory::kNvshmem) {
      // NOTE: collective: every rank allocates in the same task (Note [NVSHMEM lifetime]).
      own_ = static_cast<char*>(nvshmem::malloc(bytes));
      if (!own_) throw Error(ErrorKind::kSystem, "nvshmem_malloc of " + std::to_string(bytes) + " bytes failed");
      check(cudaMemsetAsync(own_, 0, bytes, stream), "cudaMemsetAsync (nvshmem area)");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (nvshmem area)");
    } else {
      own_ = ipc::allocate(bytes, stream);
    }
    check(cudaHostAlloc(reinterpret_cast<void**>(&err_host_), sizeof(KernelError), cudaHostAllocMapped),
          "cudaHostAlloc (error record)");
    std::memset(err_host_, 0, sizeof(KernelError));
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&err_dev_), err_host_, 0), "cudaHostGetDevicePointer");
  } catch (...) {
    releaseOwn();
    cudaSetDevice(prev);
    throw;
  }
  peers_.base[rank] = own_;
  cudaSetDevice(prev);
}

PeerTransport::~PeerTransport() {
  // Errors are ignored: at process exit the runtime may already be gone.
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) return;
  cudaSetDevice(device_);
  for (char* p : opened_) ipc::close(p);
  for (HostArea& a : opened_host_) closeHostArea(a);
  releaseOwn();
  cudaSetDevice(prev);
}

void PeerTransport::releaseOwn() {
  if (own_host_.device) {
    unlinkOwn();
    closeHostArea(own_host_);
  } else if (own_ && memory_ != PeerMemory::kNvshmem) {  // the heap is never freed (Note [NVSHMEM lifetime])
    ipc::release(own_);
  }
  own_ = nullptr;
  if (err_host_) cudaFreeHost(err_host_);
  err_host_ = nullptr;
}

std::string PeerTransport::exportHandle() const {
  if (memory_ == PeerMemory::kNvshmem) return "";
  return memory_ == PeerMemory::kHostMapped ? own_host_.seg.name : ipc::exportHandle(own_);
}

bool PeerTransport::allDirect() const {
  for (int r = 0; r < world_; ++r)
    if (!peers_.base[r]) return false;
  return true;
}

std::string PeerTransport::open(const std::vector<std::string>& handles) {
  if (static_cast<int>(handles.size()) != world_) return "expected one handle per rank";
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device_) != cudaSuccess) return "cannot select the device";
  const uint64_t bytes = areaBytes();
  std::string why;
  for (int r = 0; r < world_ && why.empty(); ++r) {
    if (r == rank_) continue;
    char* p = nullptr;
    if (memory_ == PeerMemory::kNvshmem) {
      p = static_cast<char*>(nvshmem::ptr(own_, r));  // null: reached through put-with-signal only
    } else if (memory_ == PeerMemory::kHostMapped) {
      HostArea a = openHostArea(handles[r], bytes, why);
      if (a.device) opened_host_.push_back(a);
      p = a.device;
    } else {
      p = ipc::open(handles[r], why);
      if (p) opened_.push_back(p);
    }
    if (!why.empty()) why = "rank " + std::to_string(r) + ": " + why;
    peers_.base[r] = p;
  }
  cudaSetDevice(prev);
  return why;
}

uint64_t PeerTransport::areaBytes() const {
  return ll_end_ + (schedOffset() ? schedRegionBytes(world_) : 0);
}

void PeerTransport::unlinkOwn() {
  if (memory_ == PeerMemory::kHostMapped && !own_host_.seg.name.empty()) {
    transport::unlinkSegment(own_host_.seg.name);
    own_host_.seg.name.clear();
  }
}

void PeerTransport::drain(int64_t timeout_ms) {
  // NOTE: after a failed kernel the peers' counters need not reach ours (a peer that never
  // came, or one that launched nothing once it saw a death): nothing to wait for.
  if (failedLaunch() != 0) return;
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device_) != cudaSuccess) return;
  // Note [Awaited calls]: after an awaited kernel of call s, done is s - 1; a peer whose done
  // reached s - 1 has ended its kernels up to s - 1, and its kernel of call s made every access to
  // this rank's memory before a store that this rank's kernel waited for.
  auto doneOf = [](char* base, uint64_t& v) {
    return cudaMemcpy(&v, &counterOf(base)->done, sizeof(v), cudaMemcpyDefault) == cudaSuccess;
  };
  uint64_t last = 0;
  if (doneOf(own_, last) && last > 0) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (int q = 0; q < world_; ++q) {
      // NOTE: a dead peer's area is not read (Note [GPU watchdog]): its memory may be gone.
      if (q == rank_ || !peers_.base[q]) continue;  // nvshmem without a peer address: not readable
      uint64_t v = 0;
      while (!isDead(q) && doneOf(peers_.base[q], v) && v < last && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  cudaSetDevice(prev);
}

uint64_t PeerTransport::failedLaunch() const {
  const volatile KernelError* e = err_host_;
  return e->ready ? e->launch : 0;
}

void PeerTransport::peerDied(int peer, const std::string& note) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (isDead(peer)) return;
    if (death_note_.empty()) death_note_ = note;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  __atomic_fetch_or(&err_host_->dead_ranks, 1u << peer, __ATOMIC_SEQ_CST);
}

bool PeerTransport::isDead(int peer) const {
  return (__atomic_load_n(&err_host_->dead_ranks, __ATOMIC_SEQ_CST) >> peer) & 1u;
}

std::string PeerTransport::deathNote() const {
  std::lock_guard<std::mutex> lk(mu_);
  return death_note_;
}

std::string PeerTransport::errorText() const {
  const volatile KernelError* e = err_host_;
  if (!e->ready) return "";
  static const char* kKinds[] = {"direct all_reduce", "LL all_reduce", "LL all_gather", "direct all_gather",
                                 "direct reduce_scatter", "scheduled collective", "all_to_all"};
  constexpr int kKnown = sizeof(kKinds) / sizeof(kKinds[0]);
  const std::string what = std::string(e->kind >= 0 && e->kind < kKnown ? kKinds[e->kind] : "direct call") + " #" +
                           std::to_string(e->seq) + " (" + peerMemoryName(memory_) + ")";
  const std::string peer = std::to_string(e->peer);
  if (e->reason == static_cast<int>(WaitFailure::kPeerDied)) {
    std::lock_guard<std::mutex> lk(mu_);
    return "rank " + std::to_string(rank_) + " stopped waiting on the GPU in " + what + ": " + death_note_;
  }
  if (e->reason == static_cast<int>(WaitFailure::kMismatch))
    return "collective mismatch on the GPU: rank " + peer + " sent rank " + std::to_string(rank_) +
           " data of another collective, size or algorithm in " + what;
  // Where it waited, and what it last read there (Note [Flags], Note [LL lines]).
  std::string where = " (thread block " + std::to_string(e->block);
  const unsigned long long seen = e->seen;
  if (e->seen_kind == static_cast<int>(Seen::kFlag))
    where += ": rank " + peer + "'s flag there " +
             (seen == 0 ? std::string("was never raised") : "still said #" + std::to_string(seen));
  else if (e->seen_kind == static_cast<int>(Seen::kLLFlag))
    where += ": rank " + peer + "'s line there " +
             (seen == 0 ? std::string("was never written") : "still carried #" + std::to_string(seen - 1) + "'s flag");
  where += ")";
  return "rank " + std::to_string(rank_) + " timed out on the GPU after " + std::to_string(e->waited_ns / 1000000) +
         " ms waiting for rank " + peer + " in " + what + "; rank " + peer +
         " did not arrive: it died, hangs, or called a different collective" + where;
}

}  // namespace tilecomm::cuda

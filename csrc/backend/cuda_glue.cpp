#include "backend/cuda_glue.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <initializer_list>

#include "common/error.h"
#include "common/host_stages.h"
#include "common/pci.h"
#include "cuda/nvshmem.h"
#include "exec/device_schedule.h"

namespace tilecomm::backend {

namespace {

/// Note [Direct point-to-point]: whether the settings let send and recv go GPU to GPU.
bool directP2P(const CudaSettings& s) {
  if (s.p2p != "direct" || s.ipc_bytes == 0 || s.transport == "host_mapped") return false;
  for (const auto& [pair, link] : s.gpu_links)
    if (link == "none") return false;  // peers may be on GPUs that cannot reach each other
  return true;
}

/// Note [Registered tensors]: while it lives, this thread may export and open CUDA memory even
/// where a stream is capturing a CUDA graph in the global mode (torch's default), which forbids
/// such calls to every thread; the capture records none of them.
struct RelaxedCapture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;
};

std::vector<uint8_t> toBytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string fromBytes(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

/// Whether every rank's bus id (everyRank) names one known GPU (Note [Fence scope]).
bool oneGpu(const std::vector<std::string>& devices) {
  for (const std::string& d : devices)
    if (d.empty() || d != devices[0]) return devices.size() == 1;
  return true;
}

}  // namespace

// ---------------------------------------------------------------- events

EventPool::~EventPool() {
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t EventPool::get() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  c10::cuda::CUDAGuard guard(device_);  // an event belongs to the device current at its creation
  cudaEvent_t e = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void EventPool::put(cudaEvent_t e) {
  std::lock_guard<std::mutex> lk(mu_);
  free_.push_back(e);
}

void StreamOrder::enter(const CudaOp& op) {
  if (op.captured || !last_ || last_->stream == op.stream) return;
  C10_CUDA_CHECK(cudaStreamWaitEvent(op.stream.stream(), last_->end, 0));
}

void StreamOrder::leave(std::shared_ptr<const CudaOp> op) {
  if (!op->captured) last_ = std::move(op);
}

void StreamOrder::drain() {
  if (last_) cudaEventSynchronize(last_->end);  // errors ignored: at exit the runtime may be gone
  last_.reset();
}

// ---------------------------------------------------------------- CudaOp

CudaOp::CudaOp(c10::Device d, c10::cuda::CUDAStream s, std::shared_ptr<EventPool> p, bool on_caller)
    : device(d), stream(s), on_caller_stream(on_caller), pool(std::move(p)), end(pool->get()) {
  if (!on_caller_stream) ready = pool->get();
}

CudaOp::~CudaOp() {
  if (ready) pool->put(ready);
  pool->put(end);
}

std::string CudaOp::directError() const {
  if (!ipc || direct_launch == 0) return "";
  uint64_t failed = ipc->failedLaunch();
  return failed != 0 && direct_launch >= failed ? ipc->errorText() : "";
}

bool CudaOp::endReached() const {
  if (!end_recorded) return true;
  cudaError_t e = cudaEventQuery(end);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) C10_CUDA_CHECK(e);
  (void)cudaGetLastError();  // not ready is no error: clear it
  return false;
}

void CudaOp::waitEnd() const {
  if (!end_recorded) return;
  c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  if (current == stream) return;  // ordered already (a synchronous call's wait on its own stream)
  c10::cuda::CUDAGuard guard(device);  // a stream waits on the device it belongs to
  C10_CUDA_CHECK(cudaStreamWaitEvent(current.stream(), end, 0));
}

void CudaOp::run(const std::vector<at::Tensor>& tensors, const std::function<void()>& fn) {
  // Note [Guards where needed]
  c10::cuda::OptionalCUDAGuard device_guard;
  c10::cuda::OptionalCUDAStreamGuard stream_guard;
  if (c10::cuda::current_device() != device.index()) device_guard.set_device(device);
  if (c10::cuda::getCurrentCUDAStream(device.index()) != stream) stream_guard.reset_stream(stream);
  if (order) order->enter(*this);
  auto record_end = [&] {
    C10_CUDA_CHECK(cudaEventRecord(end, stream.stream()));
    end_recorded = true;
    if (order) order->leave(shared_from_this());
  };
  if (!on_caller_stream) C10_CUDA_CHECK(cudaStreamWaitEvent(stream.stream(), ready, 0));
  host_stages::mark(host_stages::Stage::kGuarded);
  try {
    fn();
  } catch (...) {
    record_end();
    throw;
  }
  if (!on_caller_stream)  // NOTE: on the caller's stream the tensors are used where they are made
    for (const at::Tensor& t : tensors)
      if (t.is_cuda() && t.storage().data_ptr().get())
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
  record_end();
  host_stages::mark(host_stages::Stage::kEnded);
}

// ---------------------------------------------------------------- CudaGroup

CudaGroup::CudaGroup(int rank, int world, c10::intrusive_ptr<c10d::Store> store, std::string prefix,
                     CudaSettings settings, PeerWatch watch)
    : rank_(rank),
      world_(world),
      store_(std::move(store)),
      prefix_(std::move(prefix)),
      settings_(std::move(settings)),
      p2p_direct_(directP2P(settings_)),
      watch_(std::move(watch)) {}

CudaGroup::~CudaGroup() {
  releasePeers();
  if (!programs_.empty()) {  // the stream is idle (releasePeers); errors ignored at exit
    int prev = 0;
    if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(device_->index()) == cudaSuccess) {
      for (auto& [key, p] : programs_) cuda::freeProgram(p);
      cudaSetDevice(prev);
    }
  }
  // NOTE: after the peers are released (their last kernels may rely on the watchdog to stop
  // waiting), and on every path (a joinable std::thread must not be destroyed).
  if (watcher_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(watch_mu_);
      watch_stop_ = true;
    }
    watch_cv_.notify_all();
    watcher_.join();
  }
}

void CudaGroup::releasePeers() {
  if (!raw_stream_) return;
  // Errors are ignored: at process exit the runtime may already be gone. A direct kernel
  // still running ends by itself (its waits are bounded), before the buffers are freed.
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) return;
  cudaSetDevice(device_->index());
  cudaStreamSynchronize(raw_stream_);
  cudaStreamSynchronize(p2p_stream_->stream());  // its copies read peers' mappings
  order_.drain();  // a synchronous collective's kernel on a caller's stream
  // NOTE: a peer may still be reading our staging buffers in its last direct kernel; wait
  // (bounded: a dead peer reads nothing) until each says it is done, then free them.
  // (The NVSHMEM area is never freed, Note [NVSHMEM lifetime]: nothing to wait for.)
  if (ipc_ && watch_)  // a peer that died since the watchdog last looked is not waited for
    for (const auto& [rank, note] : watch_()) ipc_->peerDied(rank, note);
  if (ipc_) ipc_->drain(std::min<int64_t>(settings_.timeout_ms, 10000));
  // Note [Registered tensors]: our kernels are done (the stream is idle), and peers no longer touch
  // our tensor (drain: their kernels that read it ended, and their stores into it were awaited).
  for (auto& [key, mapping] : mapped_) cudaIpcCloseMemHandle(mapping.second);
  for (char* p : retired_) cudaIpcCloseMemHandle(p);
  mapped_.clear();
  retired_.clear();
  cudaSetDevice(prev);
}

void CudaGroup::bind(const c10::Device& device) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!device_) {
    c10::cuda::CUDAGuard guard(device);
    // NOTE: a pool stream, never destroyed: tensors the group used keep a record of
    // it in the caching allocator and may be freed after the group is gone.
    stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index());
    p2p_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index());
    raw_stream_ = stream_->stream();
    events_ = std::make_shared<EventPool>(device.index());
    device_ = device;
  }
  TORCH_CHECK_VALUE(*device_ == device, "tilecomm: this process group runs its CUDA work on ", *device_,
                    "; got a tensor on ", device, " (use one device per process and group)");
}

std::shared_ptr<CudaOp> CudaGroup::beginCollective(const c10::Device& device, bool on_caller_stream) {
  auto op = begin(device, on_caller_stream);
  op->order = &order_;
  return op;
}

std::shared_ptr<CudaOp> CudaGroup::beginP2P(const c10::Device& device) {
  bind(device);
  return begin(device, false, *p2p_stream_);
}

std::shared_ptr<CudaOp> CudaGroup::begin(const c10::Device& device, bool on_caller_stream) {
  bind(device);
  return begin(device, on_caller_stream, *stream_);
}

std::shared_ptr<CudaOp> CudaGroup::begin(const c10::Device& device, bool on_caller_stream,
                                         c10::cuda::CUDAStream internal) {
  c10::cuda::OptionalCUDAGuard guard;  // an event is recorded on its own device (Note [Guards where needed])
  if (c10::cuda::current_device() != device.index()) guard.set_device(device);
  c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  auto op = std::make_shared<CudaOp>(device, on_caller_stream ? current : internal, events_, on_caller_stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TORCH_CHECK(cudaStreamIsCapturing(current.stream(), &capture) == cudaSuccess, "tilecomm: cudaStreamIsCapturing");
  op->captured = capture != cudaStreamCaptureStatusNone;
  // Note [CUDA graphs]: under capture, this record and the internal stream's wait on it fork
  // the internal stream into the capture (a call on the caller's stream needs neither).
  if (!on_caller_stream) C10_CUDA_CHECK(cudaEventRecord(op->ready, current.stream()));
  return op;
}

namespace {
/// The call's name in every slot header of the executor's FIFOs: peers that called something else
/// fail (Note [Schedule executor]).
uint64_t slotTag(std::initializer_list<uint64_t> values) {
  uint64_t tag = 0x9e3779b97f4a7c15ull;
  for (uint64_t v : values) tag ^= v + 0x9e3779b97f4a7c15ull + (tag << 6) + (tag >> 2);
  return tag;
}

constexpr int kLastAllGatherLL = 100;  // last_kernel_ after an LL all_gather
constexpr int kLastRegistered = 150;   // after an all_reduce on registered tensors
constexpr int kLastAllGatherRegistered = 151;  // after an all_gather into registered outputs
constexpr int kLastAllToAll = 152;       // after the all_to_all kernel through the FIFOs
constexpr int kLastAllToAllRegistered = 153;  // after the all_to_all push into registered outputs
constexpr int kLastBlocks = 200;       // + BlockAlgo: after an NVSHMEM all_gather or reduce_scatter
constexpr int kLastSchedule = 1000;    // + algorithm id: after the schedule executor

// NVSHMEM's collective calls (init, heap allocations) of this process, one group at a time: the
// groups' tasks run on different threads (Note [NVSHMEM lifetime]).
std::mutex g_nvshmem_collectives;

std::optional<cuda::BlockAlgo> forcedBlocks(const std::string& forced, cuda::BlockAlgo push, cuda::BlockAlgo pull) {
  if (forced == "nvshmem_push") return push;
  if (forced == "nvshmem_pull") return pull;
  return std::nullopt;
}
}  // namespace

uint64_t CudaGroup::llLimit() const {
  if (settings_.proto == "simple" || settings_.ipc_bytes == 0) return 0;
  if (settings_.proto == "ll") return cuda::kLLMaxBytes;
  return std::min(std::max({settings_.ll_bytes[0], settings_.ll_bytes[1], settings_.allgather_ll_bytes}),
                  cuda::kLLMaxBytes);
}

bool CudaGroup::directEligible(uint64_t nbytes, DType dtype, RedOp op) const {
  if (settings_.allreduce == "staged" || settings_.allreduce == "nvshmem_two_shot" ||
      settings_.allreduce == "scheduled" || nbytes == 0 ||
      world_ > cuda::kMaxRanks || !cuda::directSupports(dtype, op))
    return false;
  // No peer transport without staging buffers; larger messages run in buffer-sized pieces.
  return settings_.ipc_bytes > 0;
}

cuda::DirectAlgo CudaGroup::allReduceAlgo(uint64_t nbytes) const {
  const int m = static_cast<int>(ipc_->memory());
  const uint64_t ll = settings_.proto == "auto" ? std::min(settings_.ll_bytes[m], llLimit()) : llLimit();
  if (nbytes <= ll) return cuda::DirectAlgo::kOneShotLL;
  const std::string& a = settings_.allreduce;
  if (a == "one_shot") return cuda::DirectAlgo::kOneShot;
  if (a == "two_shot") return cuda::DirectAlgo::kTwoShot;
  return nbytes < settings_.two_shot_bytes[m] ? cuda::DirectAlgo::kOneShot : cuda::DirectAlgo::kTwoShot;
}

bool CudaGroup::allGatherLL(uint64_t nbytes) const {
  const uint64_t ll = settings_.proto == "auto" ? std::min(settings_.allgather_ll_bytes, llLimit()) : llLimit();
  return nbytes > 0 && nbytes <= ll && world_ <= cuda::kMaxRanks;
}

std::optional<cuda::BlockAlgo> CudaGroup::allGatherBlocks(uint64_t nbytes) const {
  using cuda::BlockAlgo;
  if (nbytes == 0 || world_ > cuda::kMaxRanks) return std::nullopt;
  auto forced = forcedBlocks(settings_.allgather, BlockAlgo::kAllGatherPush, BlockAlgo::kAllGatherPull);
  if (forced) return forced;
  if (settings_.nvshmem_lib.empty() || allGatherLL(nbytes)) return std::nullopt;
  return nbytes >= settings_.allgather_pull_bytes ? BlockAlgo::kAllGatherPull : BlockAlgo::kAllGatherPush;
}

std::optional<cuda::BlockAlgo> CudaGroup::reduceScatterBlocks(uint64_t nbytes, DType dtype, RedOp op) const {
  using cuda::BlockAlgo;
  if (nbytes == 0 || world_ > cuda::kMaxRanks || !cuda::directSupports(dtype, op)) return std::nullopt;
  auto forced = forcedBlocks(settings_.reducescatter, BlockAlgo::kReduceScatterPush, BlockAlgo::kReduceScatterPull);
  if (forced) return forced;
  if (settings_.nvshmem_lib.empty()) return std::nullopt;
  return nbytes >= settings_.reducescatter_pull_bytes ? BlockAlgo::kReduceScatterPull : BlockAlgo::kReduceScatterPush;
}

std::optional<cuda::BlockAlgo> CudaGroup::allReduceBlocks(uint64_t nbytes, DType dtype, RedOp op) const {
  if (settings_.allreduce != "nvshmem_two_shot" || nbytes == 0 || world_ > cuda::kMaxRanks ||
      !cuda::directSupports(dtype, op))
    return std::nullopt;
  return cuda::BlockAlgo::kAllReduceTwoShot;
}

bool CudaGroup::scheduleEligible(Coll coll, DType dtype, RedOp op) const {
  if (coll == Coll::kAllReduce && (settings_.allreduce == "staged" || settings_.allreduce == "nvshmem_two_shot"))
    return false;
  return settings_.ipc_bytes > 0 && world_ <= cuda::kMaxRanks && cuda::scheduleSupports(dtype, op);
}

std::string CudaGroup::lastKernel() const {  // "" after a staged operation
  const int last = last_kernel_.load();
  if (last >= kLastSchedule)  // only after runSchedule, which needs the engine
    return "schedule:" + engine_->algorithms().at(static_cast<uint16_t>(last - kLastSchedule)).name;
  if (last >= kLastBlocks) return cuda::blockAlgoName(static_cast<cuda::BlockAlgo>(last - kLastBlocks));
  switch (last) {
    case static_cast<int>(cuda::DirectAlgo::kOneShot): return "allreduce_one_shot";
    case static_cast<int>(cuda::DirectAlgo::kTwoShot): return "allreduce_two_shot";
    case static_cast<int>(cuda::DirectAlgo::kOneShotLL): return "allreduce_one_shot_ll";
    case kLastAllGatherLL: return "allgather_direct_ll";
    case kLastRegistered: return "allreduce_two_shot_registered";
    case kLastAllGatherRegistered: return "allgather_push_registered";
    case kLastAllToAll: return "alltoall_fifo";
    case kLastAllToAllRegistered: return "alltoall_push_registered";
    default: return "";
  }
}

bool CudaGroup::directReady(const CudaOp& op) {
  if (op.captured && ipc_state_ == Ipc::kUnset)
    throw Error(ErrorKind::kInvalid,
                "the group's first direct CUDA collective cannot be captured in a CUDA graph (it sets up the "
                "peer transport): run one all_reduce, all_gather or all_to_all on CUDA tensors before capturing");
  if (ipc_state_ == Ipc::kUnset) ipc_state_ = setUpIpc() ? Ipc::kOn : Ipc::kOff;
  if (ipc_state_ == Ipc::kOn) {  // Note [GPU watchdog]: launch nothing that would write to a dead peer
    const std::string dead = ipc_->deathNote();
    if (!dead.empty())
      throw Error(ErrorKind::kPeerFailed, "rank " + std::to_string(rank_) +
                                              " launches no more direct kernels on the GPU: " + dead);
  }
  if (op.captured && ipc_state_ != Ipc::kOn)
    throw Error(ErrorKind::kInvalid, "cannot capture this collective in a CUDA graph: the peer transport is "
                                     "off (" + ipc_why_ + "), so it would be staged through host memory");
  return ipc_state_ == Ipc::kOn;
}

bool CudaGroup::setUpIpc() {
  // NOTE: every rank gets here in the same task (the first direct-eligible call,
  // Note [Issue order]), so the Store exchanges cannot mismatch.
  std::lock_guard<std::mutex> lk(topo_mu_);  // topo_, read by topology() from other threads
  const std::string key = prefix_ + "cuda_peers/";
  topo_.devices = busIds();
  bool no_peer_access = false;
  topo_.links.assign(world_, std::vector<std::string>(world_));
  for (int r = 0; r < world_; ++r) {
    for (int q = 0; q < world_; ++q) {
      const std::string &a = topo_.devices[r], &b = topo_.devices[q];
      std::string link = r == q ? "self" : a.empty() || b.empty() ? "unknown" : a == b ? "same_gpu" : "unknown";
      auto it = settings_.gpu_links.find(a + " " + b);
      if (link == "unknown" && it != settings_.gpu_links.end()) link = it->second;
      no_peer_access |= link == "none";
      topo_.links[r][q] = link;
    }
  }
  // cuda_ipc first unless forced off or a pair has no peer access; host_mapped needs only the host.
  std::vector<cuda::PeerMemory> kinds;
  if (settings_.transport != "host_mapped" && !no_peer_access) kinds.push_back(cuda::PeerMemory::kCudaIpc);
  kinds.push_back(cuda::PeerMemory::kHostMapped);
  for (cuda::PeerMemory m : kinds) {
    if (!tryMemory(m)) continue;
    ipc_->setOneGpu(oneGpu(topo_.devices) && settings_.fence == "auto");  // the same on every rank
    setUpPrograms();
    topo_.transport = cuda::peerMemoryName(m);
    startWatchdog();
    return true;
  }
  topo_.transport = "staged";
  return false;
}

bool CudaGroup::tryMemory(cuda::PeerMemory m) {
  std::string why, mine;
  try {
    ipc_ = std::make_shared<cuda::PeerTransport>(m, rank_, world_, device_->index(), settings_.ipc_bytes, llLimit(),
                                                 raw_stream_);
    mine = ipc_->exportHandle();
  } catch (const std::exception& e) {
    why = e.what();
  }
  const std::string key = prefix_ + "cuda_peers/" + cuda::peerMemoryName(m) + "/";
  const std::vector<std::string> handles = everyRank(key + "handle/", mine);
  if (why.empty()) why = ipc_->open(handles);
  const std::string failed = firstFailure(key + "ok/", why);
  if (!failed.empty()) {
    ipc_why_ += std::string(ipc_why_.empty() ? "" : "; ") + cuda::peerMemoryName(m) + ": " + failed;
    ipc_.reset();
    return false;
  }
  ipc_->unlinkOwn();  // every peer has opened it
  ipc_->agreeBudget(leastOf(key + "budget/", ipc_->blockBudget()));
  return true;
}

std::vector<std::string> CudaGroup::everyRank(const std::string& key, const std::string& mine) {
  store_->set(key + std::to_string(rank_), toBytes(mine));
  std::vector<std::string> all;
  for (int r = 0; r < world_; ++r) all.push_back(fromBytes(store_->get(key + std::to_string(r))));
  return all;
}

std::string CudaGroup::firstFailure(const std::string& key, const std::string& why) {
  const std::vector<std::string> all = everyRank(key, why.empty() ? "ok" : why);
  for (int r = 0; r < world_; ++r)
    if (all[r] != "ok") return "rank " + std::to_string(r) + ": " + all[r];
  return "";
}

const std::vector<std::string>& CudaGroup::busIds() {
  if (bus_ids_.empty()) {
    char bus[32] = {0};
    const bool known = cudaDeviceGetPCIBusId(bus, sizeof(bus), device_->index()) == cudaSuccess;
    bus_ids_ = everyRank(prefix_ + "cuda_peers/device/", known ? canonicalBusId(bus) : "");
  }
  return bus_ids_;
}

int CudaGroup::leastOf(const std::string& key, int mine) {
  int least = mine;
  for (const std::string& v : everyRank(key, std::to_string(mine))) least = std::min(least, std::stoi(v));
  return least;
}

void CudaGroup::setUpPrograms() {
  // An algorithm runs on the executor only where every rank's programs (every root) can be walked:
  // each rank lists its own, and the ranks agree through the Store on the ids all listed.
  std::map<uint16_t, std::vector<std::pair<int, exec::DeviceProgram>>> mine;
  std::string ids;
  for (const auto& [id, algo] : engine_->algorithms()) {  // setEngine came with the group
    if (algo.direct) continue;
    std::vector<std::pair<int, exec::DeviceProgram>> progs;
    for (int root = algo.rooted ? 0 : -1; root < (algo.rooted ? world_ : 0); ++root) {
      std::optional<exec::DeviceProgram> p = exec::deviceProgram(algo, rank_, world_, root, nullptr);
      if (!p) break;
      progs.emplace_back(root, std::move(*p));
    }
    if (progs.size() != (algo.rooted ? static_cast<size_t>(world_) : 1u)) continue;
    mine[id] = std::move(progs);
    ids += std::to_string(id) + ",";
  }
  const std::string key = prefix_ + "cuda_peers/programs/";
  std::map<uint16_t, int> listed;
  for (const std::string& v : everyRank(key, ids)) {
    for (size_t at = 0, comma; (comma = v.find(',', at)) != std::string::npos; at = comma + 1)
      ++listed[static_cast<uint16_t>(std::stoi(v.substr(at, comma - at)))];
  }
  for (auto& [id, progs] : mine) {
    if (listed[id] != world_) continue;
    for (auto& [root, p] : progs) programs_[{id, root}] = cuda::uploadProgram(p);
    const int coll = static_cast<int>(engine_->algorithms().at(id).coll);
    if (!first_program_.count(coll)) first_program_[coll] = id;
  }
}

uint16_t CudaGroup::executorPick(const exec::CollCall& call) const {
  if (ipc_->memory() == cuda::PeerMemory::kNvshmem) return call.algo;  // no executor over NVSHMEM's heap
  const auto& tables = settings_.executor_tables[static_cast<int>(ipc_->memory())];
  const size_t c = static_cast<size_t>(call.coll);
  if (c >= tables.size() || tables[c].empty()) return call.algo;
  const uint64_t nbytes = call.count * dtypeSize(call.dtype);  // as the CPU table is asked (the buffer's bytes)
  uint16_t id = tables[c].back().second;
  for (const auto& e : tables[c])
    if (nbytes <= e.first) {
      id = e.second;
      break;
    }
  const auto it = engine_->algorithms().find(id);
  return it != engine_->algorithms().end() && it->second.coll == call.coll ? id : call.algo;
}

void CudaGroup::runSchedule(CudaOp& op, const exec::CollCall& call) {
  // A non-rooted algorithm's program is filed under root -1.
  auto program = [&](uint16_t algo) { return programs_.find({algo, engine_->algorithms().at(algo).rooted ? call.root : -1}); };
  uint16_t algo = executorPick(call);
  auto it = program(algo);
  if (it == programs_.end()) {  // the table's choice has no program: the collective's first that has
    auto first = first_program_.find(static_cast<int>(call.coll));
    if (first == first_program_.end())
      throw Error(ErrorKind::kInvalid, std::string("no algorithm of ") + collName(call.coll) +
                                           " can run on the GPU's schedule executor");
    algo = first->second;
    it = program(algo);
  }
  const uint64_t tag = slotTag({static_cast<uint64_t>(call.coll), static_cast<uint64_t>(algo),
                                 static_cast<uint64_t>(call.dtype), static_cast<uint64_t>(call.op),
                                 static_cast<uint64_t>(call.root + 1), call.desc_count, call.count});
  const uint64_t timeout_ms = call.timeout_ms > 0 ? call.timeout_ms : settings_.timeout_ms;
  last_kernel_ = kLastSchedule + algo;
  op.direct_launch = cuda::runSchedule(*ipc_, it->second, call.buf, call.count, dtypeSize(call.dtype), call.dtype,
                                       call.op, tag, op.stream.stream(), timeout_ms * 1000000ull);
  op.ipc = ipc_;
}

void CudaGroup::startWatchdog() {
  if (watch_ && !watcher_.joinable()) watcher_ = std::thread([this] { watchLoop(); });
}

void CudaGroup::watchLoop() {
  std::unique_lock<std::mutex> lk(watch_mu_);
  while (!watch_stop_) {
    watch_cv_.wait_for(lk, std::chrono::milliseconds(20));
    if (watch_stop_) return;
    for (const auto& [rank, note] : watch_())
      for (const auto& t : {ipc_, nvs_})
        if (t) t->peerDied(rank, note);
  }
}

bool CudaGroup::setUpNvshmem() {
  try {
    return setUpNvshmemOnce();
  } catch (const std::exception& e) {  // a Store timeout: no second attempt with the same keys
    nvs_why_ = e.what();
    return false;
  }
}

bool CudaGroup::setUpNvshmemOnce() {
  // NOTE: every rank gets here in the same task (Note [Issue order]); each step is agreed through
  // the Store before the next, so that no rank enters a collective NVSHMEM call that another
  // rank will not make (a library that loads on one rank only, an init that fails on one).
  std::lock_guard<std::mutex> collectives(g_nvshmem_collectives);
  const std::string key = prefix_ + "nvshmem/";
  auto agree = [&](const std::string& step, const std::string& why) { return firstFailure(key + step + "/", why); };
  std::string why = settings_.nvshmem_lib.empty() ? settings_.nvshmem_why : cuda::nvshmem::load(settings_.nvshmem_lib);
  if (rank_ == 0)  // a process that initialised NVSHMEM already needs no new id
    store_->set(key + "uid", toBytes(why.empty() && cuda::nvshmem::myPe() < 0 ? cuda::nvshmem::uniqueId() : ""));
  why = agree("loaded", why);
  if (why.empty()) {
    c10::cuda::CUDAGuard guard(*device_);
    why = agree("init", cuda::nvshmem::init(rank_, world_, fromBytes(store_->get(key + "uid"))));
  }
  if (why.empty()) {
    std::string mine;
    std::shared_ptr<cuda::PeerTransport> t;
    try {  // NOTE: collective (nvshmem_malloc); the heap is zeroed before the barrier below
      t = std::make_shared<cuda::PeerTransport>(cuda::PeerMemory::kNvshmem, rank_, world_, device_->index(),
                                                settings_.nvshmem_bytes, 0, raw_stream_);
      mine = t->open(std::vector<std::string>(world_));
    } catch (const std::exception& e) {
      mine = e.what();
    }
    // Every PE's area is zeroed before any peer may put into it.
    cuda::nvshmem::barrierAll();
    why = agree("area", mine);
    if (why.empty()) {
      t->agreeBudget(leastOf(key + "budget/", t->blockBudget()));
      // Kernel stores need a peer address of every rank's area on every rank; else every rank
      // moves data with put-with-signal.
      nvs_direct_ = settings_.nvshmem_data == "auto" &&
                    agree("direct", t->allDirect() ? "" : "no peer address of some rank's area").empty();
      // Note [Fence scope]: with every PE on this one GPU, the heap is that GPU's memory. Not with
      // put-with-signal, whose flags NVSHMEM writes.
      t->setOneGpu(nvs_direct_ && settings_.fence == "auto" && oneGpu(busIds()));
      std::lock_guard<std::mutex> lk(watch_mu_);
      nvs_ = std::move(t);
    }
  }
  if (!why.empty()) {
    nvs_why_ = why;
    return false;
  }
  startWatchdog();
  return true;
}

std::optional<cuda::BlockAlgo> CudaGroup::nvshmemReady(const CudaOp& op, cuda::BlockAlgo algo) {
  using cuda::BlockAlgo;
  const std::string name = cuda::blockAlgoName(algo);
  const bool gather = algo == BlockAlgo::kAllGatherPush || algo == BlockAlgo::kAllGatherPull;
  const bool all = algo == BlockAlgo::kAllReduceTwoShot;  // only ever forced (allReduceBlocks)
  const bool forced = all || !(gather ? settings_.allgather : settings_.reducescatter).empty();
  const bool pull = algo == BlockAlgo::kAllGatherPull || algo == BlockAlgo::kReduceScatterPull;
  // Note [NVSHMEM capture]: the kernels that store and load through peer addresses take their
  // sequence from the device (Note [Device sequence]), so a graph holds them. The set-up (collective
  // calls through the Store) and put-with-signal (whose signal values the host counts) cannot be
  // captured: there an unforced call takes the path it would take without NVSHMEM (the schedule
  // executor), and a forced push raises (a forced pull or two-shot raises below, as eagerly). Every
  // rank captures the same calls, so all agree.
  const bool put_signal = nvs_state_ == Ipc::kOn && !nvs_direct_ && !(forced && (pull || all));
  if (op.captured && (nvs_state_ == Ipc::kUnset || put_signal)) {
    if (!forced) return std::nullopt;
    throw Error(ErrorKind::kInvalid,
                name + " cannot be captured in a CUDA graph: " +
                    (nvs_state_ == Ipc::kUnset
                         ? "the group's first NVSHMEM collective sets NVSHMEM up; run one before capturing"
                         : "it moves data with put-with-signal, whose signal values are counted on the host"));
  }
  if (nvs_state_ == Ipc::kUnset) nvs_state_ = setUpNvshmem() ? Ipc::kOn : Ipc::kOff;
  std::string why;
  if (nvs_state_ != Ipc::kOn) {
    why = "NVSHMEM is not available: " + nvs_why_;
  } else if ((pull || all) && !nvs_direct_) {
    // Pull and the all_reduce two-shot read peers' memory, which only peer addresses can do;
    // unforced (pull only), push replaces it.
    if (!forced) algo = gather ? BlockAlgo::kAllGatherPush : BlockAlgo::kReduceScatterPush;
    else why = "it reads peers' memory, which needs peer addresses (nvshmem_ptr) of every rank's memory, and this "
               "group moves data with put-with-signal (TILECOMM_NVSHMEM_DATA, or a rank without peer addresses)";
  }
  if (!why.empty()) {
    if (forced)
      throw Error(ErrorKind::kInvalid,
                  std::string(all ? "TILECOMM_CUDA_ALLREDUCE" : "TILECOMM_ALGO") + " forces " + name + ", but " + why);
    return std::nullopt;
  }
  const std::string dead = nvs_->deathNote();  // Note [GPU watchdog]
  if (!dead.empty())
    throw Error(ErrorKind::kPeerFailed, "rank " + std::to_string(rank_) +
                                            " launches no more direct kernels on the GPU: " + dead);
  return algo;
}

void CudaGroup::blocksDirect(CudaOp& op, cuda::BlockAlgo algo, const cuda::BlockCall& call, int64_t timeout_ms) {
  last_kernel_ = kLastBlocks + static_cast<int>(algo);
  bool in_place = false;
  op.direct_launch = cuda::runBlocks(algo, *nvs_, call, !nvs_direct_, op.stream.stream(),
                                     static_cast<uint64_t>(timeout_ms) * 1000000ull, &in_place);
  if (in_place) ++in_place_calls_;
  op.ipc = nvs_;
}

void* CudaGroup::symmetricAlloc(uint64_t nbytes, const c10::Device& device) {
  bind(device);
  if (nvs_state_ == Ipc::kUnset) nvs_state_ = setUpNvshmem() ? Ipc::kOn : Ipc::kOff;
  if (nvs_state_ != Ipc::kOn)
    throw Error(ErrorKind::kInvalid, "tilecomm: no symmetric memory: NVSHMEM is not available: " + nvs_why_);
  c10::cuda::CUDAGuard guard(device);
  std::lock_guard<std::mutex> collectives(g_nvshmem_collectives);
  void* p = cuda::nvshmem::malloc(std::max<uint64_t>(nbytes, 1));  // collective
  if (!p) throw Error(ErrorKind::kSystem, "nvshmem_malloc of " + std::to_string(nbytes) + " bytes failed");
  return p;
}

bool CudaGroup::registerEligible(uint64_t nbytes, bool captured) const {
  if (ipc_->memory() != cuda::PeerMemory::kCudaIpc) return false;
  if (settings_.allreduce == "registered") return true;
  const uint64_t from = captured ? settings_.captured_register_bytes : settings_.register_bytes;
  return settings_.allreduce == "auto" && from > 0 && nbytes >= from &&
         allReduceAlgo(nbytes) != cuda::DirectAlgo::kOneShotLL;
}

/// What a rank tells its peers about its tensor (Note [Registered tensors]).
struct TensorExport {
  cudaIpcMemHandle_t handle;
  uint64_t base;    // the allocation's address in the exporting process
  uint64_t id;      // its unique id there
  uint64_t offset;  // of the tensor in the allocation
  uint64_t extent;  // bytes of the call's range: every rank's must be the same
  uint64_t issued;  // collectives the group issued before this call: every rank's must be the same
  uint8_t ok;       // exported
  uint8_t known;    // every peer opened this allocation before
  uint8_t pad[6];
};

namespace {
/// The device allocation holding p: its start, its size and its process-wide unique id (never
/// reused, unlike addresses and, possibly, IPC handles), from the driver. False where unknown.
bool allocationOf(const void* p, uint64_t* base, uint64_t* size, uint64_t* id) {
  using Fn = CUresult (*)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr);
  static Fn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &f, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuPointerGetAttributes", &f, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<Fn>(nullptr);
    }
    return reinterpret_cast<Fn>(f);
  }();
  if (!fn) return false;
  CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                  CU_POINTER_ATTRIBUTE_BUFFER_ID};
  CUdeviceptr start = 0;
  size_t bytes = 0;
  unsigned long long buffer = 0;
  void* data[3] = {&start, &bytes, &buffer};
  if (fn(3, attrs, data, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS || start == 0) return false;
  *base = static_cast<uint64_t>(start);
  *size = bytes;
  *id = buffer;
  return true;
}
}  // namespace

void CudaGroup::exchange(void* all, uint64_t each, int64_t timeout_ms) {
  const uint64_t n = each * world_;
  engine_->run(exec::CollCall{Coll::kAllGather, engine_->pick(Coll::kAllGather, n), static_cast<char*>(all), n,
                              DType::kBytes, RedOp::kNone, -1, each, timeout_ms});
}

char* CudaGroup::peerAllocation(cudaStream_t stream, int q, uint64_t base, uint64_t id,
                                 const cudaIpcMemHandle_t& handle, bool retire) {
  std::lock_guard<std::mutex> lk(mapped_mu_);
  auto it = mapped_.find({q, base});
  if (it != mapped_.end() && it->second.first == id) return it->second.second;  // every call's path: no CUDA call
  RelaxedCapture relaxed;  // closing and opening, which a global-mode capture forbids
  if (it != mapped_.end()) {
    // A new allocation at a known address: the old one was freed. Earlier kernels and copies may
    // still read the old mapping.
    if (retire) {
      retired_.push_back(it->second.second);
    } else {
      for (cudaStream_t s : {stream, raw_stream_, p2p_stream_->stream()}) {
        const cudaError_t synced = cudaStreamSynchronize(s);
        if (synced != cudaSuccess)
          throw Error(ErrorKind::kSystem, std::string("cudaStreamSynchronize: ") + cudaGetErrorString(synced));
      }
      cudaIpcCloseMemHandle(it->second.second);
    }
    mapped_.erase(it);
  }
  void* p = nullptr;
  cudaError_t err = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clears it
    throw Error(ErrorKind::kSystem, "rank " + std::to_string(rank_) + " cannot open rank " + std::to_string(q) +
                                        "'s CUDA memory: " + cudaGetErrorString(err));
  }
  mapped_[{q, base}] = {id, static_cast<char*>(p)};
  return static_cast<char*>(p);
}

std::optional<std::vector<char*>> CudaGroup::registerTensors(CudaOp& op, void* p, uint64_t extent, bool exportable,
                                                             int64_t timeout_ms) {
  std::vector<TensorExport> all(world_);
  TensorExport& mine = all[rank_];
  uint64_t base = 0, size = 0, id = 0;
  // NOTE: all of the tensor within the allocation: a list of outputs that lie back to back may
  // span two allocations, and peers would store past the one they opened.
  // A known allocation needs no handle (every peer has it open), so the driver is asked for one
  // only until it is known, not on every call.
  RelaxedCapture relaxed;
  if (exportable && allocationOf(p, &base, &size, &id) && reinterpret_cast<uint64_t>(p) + extent <= base + size &&
      (known_.count(id) || cudaIpcGetMemHandle(&mine.handle, reinterpret_cast<void*>(base)) == cudaSuccess)) {
    mine.ok = 1;
    mine.base = base;
    mine.id = id;
    mine.offset = reinterpret_cast<uint64_t>(p) - base;
    mine.known = known_.count(id) ? 1 : 0;
  } else {
    cudaGetLastError();  // not within one cudaMalloc allocation (expandable segments, a VMM heap, pool memory)
  }
  mine.extent = extent;
  mine.issued = op.issued;
  exchange(all.data(), sizeof(TensorExport), timeout_ms);
  for (int q = 0; q < world_; ++q) {  // the same answer on every rank: each sees every extent and count
    if (all[q].extent != extent)
      throw Error(ErrorKind::kDesync, "collective mismatch on the GPU: rank " + std::to_string(q) + " registered " +
                                          std::to_string(all[q].extent) + " bytes for this call, rank " +
                                          std::to_string(rank_) + " " + std::to_string(extent));
    if (all[q].issued != op.issued)
      throw Error(ErrorKind::kDesync,
                  "collective mismatch on the GPU: rank " + std::to_string(q) + " registered tensors for its call " +
                      std::to_string(all[q].issued) + ", rank " + std::to_string(rank_) + " for its call " +
                      std::to_string(op.issued) +
                      " (every rank must issue the same collectives, and capture the same ones in a CUDA graph)");
  }
  bool every_known = true;
  for (const TensorExport& e : all) {
    if (!e.ok) return std::nullopt;  // the same answer on every rank
    every_known &= e.known != 0;
  }
  std::vector<char*> tensors(world_);
  std::string why;
  for (int q = 0; q < world_ && why.empty(); ++q) {
    if (q == rank_) {
      tensors[q] = static_cast<char*>(p);
      continue;
    }
    try {
      // Under capture no stream may be synchronized: a replaced mapping is retired.
      tensors[q] = peerAllocation(op.stream.stream(), q, all[q].base, all[q].id, all[q].handle, op.captured) +
                   all[q].offset;
    } catch (const std::exception& e) {  // every rank must reach the agreement below
      why = e.what();
    }
  }
  if (!every_known) {  // some allocation is new to some peer: did every rank open every one?
    std::vector<uint8_t> opened(world_);
    opened[rank_] = why.empty() ? 1 : 0;
    exchange(opened.data(), 1, timeout_ms);
    for (uint8_t o : opened)
      if (!o) return std::nullopt;  // the same answer on every rank: the staged kernels run
    known_.insert(mine.id);
  } else if (!why.empty()) {
    // Every allocation was known, so its mapping was open here: not reached unless the CUDA
    // context failed. The peers' kernels then wait for this rank until the timeout.
    throw Error(ErrorKind::kSystem, why);
  }
  return tensors;
}

bool CudaGroup::allReduceRegistered(CudaOp& op, at::Tensor& t, DType dtype, RedOp rop, int64_t timeout_ms) {
  const auto tensors = registerTensors(op, t.data_ptr(), t.nbytes(), true, timeout_ms);
  if (!tensors) return false;
  last_kernel_ = kLastRegistered;
  op.direct_launch = cuda::allReduceRegistered(*ipc_, tensors->data(), t.nbytes(), dtype, rop, op.stream.stream(),
                                               static_cast<uint64_t>(timeout_ms) * 1000000ull);
  op.ipc = ipc_;
  ++registered_calls_;
  return true;
}

bool CudaGroup::allGatherRegisterEligible(uint64_t nbytes, bool one_range) const {
  const uint64_t from = settings_.allgather_register_bytes;  // 0 where TILECOMM_ALGO forces an all_gather
  // Above the LL limit; and with TILECOMM_PROTO=auto, under it too from where the CUDA model prices the push
  // into registered outputs below LL, for an output that is one range on every rank (a list of outputs
  // would pay the exchange and then, mostly, run LL anyway). An output that does not register runs LL.
  return from > 0 && settings_.ipc_bytes > 0 && nbytes > 0 && nbytes * world_ >= from && world_ <= cuda::kMaxRanks &&
         (!allGatherLL(nbytes) ||
          (one_range && settings_.proto == "auto" && nbytes > settings_.allgather_register_ll_bytes));
}

bool CudaGroup::allGatherRegistered(CudaOp& op, const at::Tensor& in, const std::vector<void*>& outs,
                                    int64_t timeout_ms) {
  // NOTE: every condition here is the same on every rank (the transport's).
  if (!directReady(op) || ipc_->memory() != cuda::PeerMemory::kCudaIpc) return false;
  const uint64_t n = in.nbytes();
  bool contiguous = true;  // the output is one range (all_gather_into_tensor; a list may be too)
  for (int q = 1; q < world_; ++q) contiguous &= outs[q] == static_cast<char*>(outs[0]) + q * n;
  const auto outputs = registerTensors(op, outs[0], n * world_, contiguous, timeout_ms);
  if (!outputs) return false;
  last_kernel_ = kLastAllGatherRegistered;
  op.direct_launch = cuda::allGatherRegistered(*ipc_, static_cast<const char*>(in.data_ptr()), outputs->data(), n,
                                               op.stream.stream(), static_cast<uint64_t>(timeout_ms) * 1000000ull);
  op.ipc = ipc_;
  ++registered_calls_;
  return true;
}

void CudaGroup::allReduceDirect(CudaOp& op, at::Tensor& t, DType dtype, RedOp rop, int64_t timeout_ms) {
  if (registerEligible(t.nbytes(), op.captured) && allReduceRegistered(op, t, dtype, rop, timeout_ms)) return;
  const cuda::DirectAlgo algo = allReduceAlgo(t.nbytes());
  last_kernel_ = static_cast<int>(algo);
  uint64_t timeout_ns = static_cast<uint64_t>(timeout_ms) * 1000000ull;
  // Pieces of at most one staging buffer, cut at 256-byte boundaries (every dtype's
  // elements and the kernels' vector loads stay aligned); each is an all_reduce of its own.
  const uint64_t piece = algo == cuda::DirectAlgo::kOneShotLL ? t.nbytes() : ipc_->capacity() / 256 * 256;
  char* base = static_cast<char*>(t.data_ptr());
  host_stages::mark(host_stages::Stage::kReady);
  for (uint64_t off = 0; off < t.nbytes(); off += piece) {
    op.direct_launch = cuda::allReduceDirect(algo, *ipc_, base + off, std::min(piece, t.nbytes() - off), dtype, rop,
                                             op.stream.stream(), timeout_ns);
  }
  host_stages::mark(host_stages::Stage::kLaunched);
  op.ipc = ipc_;
}

void CudaGroup::allGatherDirect(CudaOp& op, const at::Tensor& in, const std::vector<void*>& outs,
                                int64_t timeout_ms) {
  uint64_t timeout_ns = static_cast<uint64_t>(timeout_ms) * 1000000ull;
  last_kernel_ = kLastAllGatherLL;
  host_stages::mark(host_stages::Stage::kReady);
  op.direct_launch = cuda::allGatherDirectLL(*ipc_, in.data_ptr(), outs.data(), in.nbytes(), op.stream.stream(),
                                             timeout_ns);
  host_stages::mark(host_stages::Stage::kLaunched);
  op.ipc = ipc_;
}

bool CudaGroup::allToAll(CudaOp& op, const cuda::AllToAllCall& call, bool equal, DType dtype, int64_t timeout_ms) {
  // NOTE: every condition is the same on every rank (the settings, the transport's, the capture's)
  // but `equal`, which each rank reads off its own splits: the registered setting is the user's
  // promise that every rank's are equal too.
  if (!allToAllEligible() || !directReady(op)) return false;
  // Note [Registered tensors]: with TILECOMM_CUDA_ALLTOALL=registered, equal blocks into one output
  // of TILECOMM_CUDA_REGISTER_BYTES or more are stored into the peers' outputs in place (one copy
  // instead of the FIFOs' two); the setting is the user's word that every rank sees equal blocks.
  const uint64_t n = call.out_bytes[0];
  const uint64_t from = settings_.alltoall_register_bytes;
  if (equal && n > 0 && from > 0 && n * world_ >= from && ipc_->memory() == cuda::PeerMemory::kCudaIpc) {
    const auto outputs = registerTensors(op, call.out[0], n * world_, true, timeout_ms);
    if (outputs) {
      last_kernel_ = kLastAllToAllRegistered;
      op.direct_launch = cuda::allToAllRegistered(*ipc_, call.in, outputs->data(), n, op.stream.stream(),
                                                  static_cast<uint64_t>(timeout_ms) * 1000000ull);
      op.ipc = ipc_;
      ++registered_calls_;
      return true;
    }
  }
  if (!cuda::allToAllFits(*ipc_)) {
    if (op.captured)
      throw Error(ErrorKind::kInvalid, "cannot capture all_to_all in a CUDA graph: its kernel's " +
                                           std::to_string(2 * world_ - 1) + " lanes exceed the block budget of " +
                                           std::to_string(ipc_->blockBudget()) + ", so it would be staged");
    return false;
  }
  // The sizes are checked per block, from each side's own splits.
  const uint64_t tag = slotTag({static_cast<uint64_t>(Coll::kAllToAll), static_cast<uint64_t>(dtype)});
  last_kernel_ = kLastAllToAll;
  op.direct_launch = cuda::allToAllFifo(*ipc_, call, tag, op.stream.stream(),
                                        static_cast<uint64_t>(timeout_ms) * 1000000ull);
  op.ipc = ipc_;
  return true;
}

void CudaGroup::runStaged(const std::vector<at::Tensor>& reads, const std::vector<at::Tensor>& writes,
                          const std::function<void(const Host&)>& body) {
  last_kernel_ = -1;
  Host host;
  auto twin = [&](const at::Tensor& t, bool read) {
    if (!t.is_cuda() || host.has(t)) return;
    at::Tensor h = pinnedLike(t);
    if (read) h.copy_(t, /*non_blocking=*/true);
    host.add(t, h);
  };
  for (const at::Tensor& t : reads) twin(t, true);
  for (const at::Tensor& t : writes) twin(t, false);
  c10::cuda::getCurrentCUDAStream().synchronize();  // the operation's stream: inputs are on the host now
  body(host);
  for (const at::Tensor& t : writes)
    if (t.is_cuda()) t.copy_(host(t), /*non_blocking=*/true);
}

std::string CudaGroup::failure() const {
  for (const cuda::PeerTransport* t : {ipc_.get(), nvs_.get()}) {  // NOTE: every call asks: no refcounts
    std::string e = t ? t->errorText() : "";
    if (!e.empty()) return e;
  }
  return "";
}

std::string CudaGroup::status() const {
  // NOTE: plain strings, no iostreams: some toolchains link a private libstdc++ into the
  // extension, whose stream facets then clash with the process's locale.
  auto pair = [](const uint64_t (&v)[cuda::kMemories]) { return std::to_string(v[0]) + "/" + std::to_string(v[1]); };
  return "device=" + (device_ ? device_->str() : std::string("unbound")) + " allreduce=" + settings_.allreduce +
         " ipc_bytes=" + std::to_string(settings_.ipc_bytes) + " two_shot_bytes=" + pair(settings_.two_shot_bytes) +
         " proto=" + settings_.proto + " ll_bytes=" + pair(settings_.ll_bytes) + " allgather_ll_bytes=" +
         std::to_string(settings_.allgather_ll_bytes) + " allgather_register_ll_bytes=" +
         std::to_string(settings_.allgather_register_ll_bytes) + " ll_limit=" + std::to_string(llLimit()) + " direct=" +
         (ipc_state_ == Ipc::kOn ? "on" : ipc_state_ == Ipc::kOff ? "off (" + ipc_why_ + ")" : "unset") +
         (ipc_state_ == Ipc::kOn ? " memory=" + topo_.transport + " fence=" + (ipc_->oneGpu() ? "gpu" : "system")
                                 : "") +
         " nvshmem=" +
         (nvs_state_ == Ipc::kOn ? std::string(nvs_direct_ ? "on" : "on (put_signal)") + " nvshmem_fence=" +
                                       (nvs_->oneGpu() ? "gpu" : "system")
          : nvs_state_ == Ipc::kOff ? "off (" + nvs_why_ + ")"
          : settings_.nvshmem_lib.empty() ? "not offered (" + settings_.nvshmem_why + ")"
                                          : "unset") +
         " in_place_calls=" + std::to_string(in_place_calls_.load()) +
         " registered_calls=" + std::to_string(registered_calls_.load()) +
         " programs=" + std::to_string(programs_.size()) + " p2p=" + (p2pDirect() ? "direct" : "staged") +
         " p2p_exported=" + std::to_string(p2p_exported_.load()) + " p2p_copies=" + std::to_string(p2p_copies_.load());
}

GpuTopology CudaGroup::topology() const {
  std::lock_guard<std::mutex> lk(topo_mu_);
  GpuTopology t = topo_;
  if (ipc_state_ == Ipc::kUnset) t.transport = settings_.allreduce == "staged" ? "staged" : "unset";
  return t;
}

// ---------------------------------------------------------------- point-to-point

int64_t p2pDescTag(int tag) { return exec::kInternalTags + (static_cast<int64_t>(tag) - INT32_MIN); }
int64_t p2pReplyTag(uint64_t seq) { return 2 * exec::kInternalTags + static_cast<int64_t>(seq % exec::kInternalTags); }
int64_t p2pDataTag(uint64_t seq) { return 3 * exec::kInternalTags + static_cast<int64_t>(seq % exec::kInternalTags); }

exec::P2POp p2pMessage(bool send, int peer, int64_t tag, void* ptr, size_t nbytes, int64_t timeout_ms,
                       std::string label, std::function<void(int, const std::string&)> done) {
  exec::P2POp op;
  op.send = send;
  op.peer = peer;
  op.tag = tag;
  op.ptr = static_cast<char*>(ptr);
  op.nbytes = nbytes;
  op.timeout_ms = timeout_ms;
  op.label = std::move(label);
  op.done = std::move(done);
  return op;
}

P2PDesc CudaGroup::p2pExport(const CudaOp& op, const at::Tensor& t, int dst) {
  P2PDesc d;
  d.nbytes = t.nbytes();
  {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    if (p2p_sent_.empty()) p2p_sent_.assign(world_, 0);
    d.seq = p2p_sent_[dst]++;
  }
  C10_CUDA_CHECK(cudaEventSynchronize(op.ready));  // t is written
  uint64_t base = 0, size = 0, id = 0;
  void* p = t.data_ptr();
  if (d.nbytes > 0 && allocationOf(p, &base, &size, &id) && reinterpret_cast<uint64_t>(p) + d.nbytes <= base + size &&
      cudaIpcGetMemHandle(&d.handle, reinterpret_cast<void*>(base)) == cudaSuccess) {
    d.exported = 1;
    d.base = base;
    d.id = id;
    d.offset = reinterpret_cast<uint64_t>(p) - base;
    ++p2p_exported_;
  } else {
    cudaGetLastError();  // not exportable: the bytes go through host memory
  }
  return d;
}

namespace {
/// A reply waiting for its copy to end (cudaLaunchHostFunc's argument).
struct PendingReply {
  std::weak_ptr<exec::Engine> engine;
  int dst;
  uint64_t seq;
  P2PReply reply;
  int64_t timeout_ms;
};

void postReply(std::shared_ptr<exec::Engine> engine, int dst, uint64_t seq, P2PReply reply, int64_t timeout_ms) {
  auto payload = std::make_shared<P2PReply>(reply);
  // A failure reaches the sender as its own.
  engine->p2p().post(p2pMessage(true, dst, p2pReplyTag(seq), payload.get(), sizeof(P2PReply), timeout_ms,
                                "the reply to rank " + std::to_string(dst) + "'s CUDA send",
                                [payload](int, const std::string&) {}));
}

// NOTE: runs on a thread of the CUDA runtime, so it makes no CUDA call: it only queues a message
// (and throws nothing: there is no one to catch it).
void replyAfterCopy(void* arg) {
  std::unique_ptr<PendingReply> r(static_cast<PendingReply*>(arg));
  try {
    if (auto engine = r->engine.lock()) postReply(std::move(engine), r->dst, r->seq, r->reply, r->timeout_ms);
  } catch (...) {  // out of memory: the sender's send times out and fails the group
  }
}
}  // namespace

void CudaGroup::p2pCopy(CudaOp& op, const at::Tensor& t, int src, const P2PDesc& d, int64_t timeout_ms) {
  c10::cuda::CUDAGuard guard(op.device);  // this thread's device, for opening
  char* peer = peerAllocation(op.stream.stream(), src, d.base, d.id, d.handle, true) + d.offset;
  op.run({t}, [&] {
    C10_CUDA_CHECK(cudaMemcpyAsync(t.data_ptr(), peer, d.nbytes, cudaMemcpyDeviceToDevice, op.stream.stream()));
    auto r = std::make_unique<PendingReply>(PendingReply{engine_, src, d.seq, P2PReply{}, timeout_ms});
    C10_CUDA_CHECK(cudaLaunchHostFunc(op.stream.stream(), replyAfterCopy, r.get()));
    r.release();  // replyAfterCopy owns it
  });
  ++p2p_copies_;
}

void CudaGroup::p2pKeep(const at::Tensor& t) {
  std::lock_guard<std::mutex> lk(p2p_mu_);
  p2p_kept_.push_back(t);
}

void CudaGroup::p2pReply(int dst, uint64_t seq, P2PReply reply, int64_t timeout_ms) {
  postReply(engine_, dst, seq, reply, timeout_ms);
}

void CudaGroup::p2pDrain() {
  if (!p2p_stream_) return;
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) return;  // at process exit the runtime may be gone
  cudaSetDevice(device_->index());
  cudaStreamSynchronize(p2p_stream_->stream());
  cudaSetDevice(prev);
}

at::Tensor pinnedLike(const at::Tensor& t) {
  return at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).pinned_memory(true));
}

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

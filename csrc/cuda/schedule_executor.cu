// The schedule executor's kernel and host side (Note [Schedule executor] in schedule_executor.h).
#include "cuda/schedule_executor.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "cuda/allreduce.h"
#include "cuda/dispatch.cuh"

namespace tilecomm::cuda {

static_assert(kSchedLanes == exec::kDeviceMaxLanes, "one lane per step of a round");
static_assert(kSchedSlotBytes % 16 == 0 && kSchedHeaderBytes % 16 == 0, "slots hold whole vectors");

namespace {

struct SchedArgs : CallArgs {
  const exec::DeviceStep* steps;
  const uint32_t* round_end;
  uint32_t rounds;
  uint32_t per_lane;  // thread blocks per lane
  uint32_t nchunks;
  uint64_t sched_offset;
  char* buf;
  uint64_t count;
  uint32_t elem;
  uint64_t tag;
};

/// What a sender writes in front of a slice.
struct SlotHeader {
  uint64_t tag;
  uint64_t step_bytes;
};

__device__ __forceinline__ uint64_t* word(const SchedArgs& a, char* base, uint64_t w) {
  return reinterpret_cast<uint64_t*>(base + a.sched_offset) + w;
}

/// Slot n % kSchedSlots of the FIFO from `src` on channel `ch`, in the area at `base` (the destination's).
__device__ __forceinline__ char* slotOf(const SchedArgs& a, char* base, int src, int ch, uint64_t n) {
  const uint64_t fifo = static_cast<uint64_t>(src) * kSchedChannels + ch;
  return base + a.sched_offset + kSchedControlBytes + (fifo * kSchedSlots + n % kSchedSlots) * kSchedSlotStride;
}

/// Byte offset of chunk c (exec::chunkOffset on the device).
__device__ __forceinline__ uint64_t chunkAt(uint64_t c, const SchedArgs& a) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(c) * a.count) / a.nchunks) * a.elem;
}

/// A lane's progress word: call, round, slices done (monotonic over calls).
__device__ __forceinline__ uint64_t progressValue(uint64_t seq, uint32_t round, uint64_t slices) {
  return (seq << 32) | (static_cast<uint64_t>(round) << 20) | slices;
}

__device__ __forceinline__ uint64_t loadAcquireGpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

/// Thread 0: waits until *p >= want. False once the wait timed out, a peer died, or another wait
/// of this rank failed (recorded for the host).
__device__ bool waitAtLeast(const SchedArgs& a, const uint64_t* p, uint64_t want, int peer, uint64_t seq, bool local) {
  auto load = [&] { return local ? loadAcquireGpu(p) : loadAcquire(p); };
  if (load() >= want) return true;
  const uint64_t start = globalTimer();
  for (uint32_t polls = 1;; ++polls) {
    if (load() >= want) return true;
    if (polls > 64) __nanosleep(64);
    if (polls % 256 == 0) {
      if (*reinterpret_cast<volatile unsigned int*>(&a.err->claimed) != 0u) return false;
      if (waitFailed(a, peer, seq, start)) return false;
    }
  }
}

/// Vector v of a buffer this kernel's other blocks may have written: loads cached in L2 only.
__device__ __forceinline__ uint4 loadBuf(const char* p, uint64_t v, uint64_t nbytes, bool aligned) {
  const uint64_t off = v * 16;
  if (aligned && off + 16 <= nbytes) return __ldcg(reinterpret_cast<const uint4*>(p + off));
  return loadBytes(p + off, bytesOf(v, nbytes), [](const char* b) { return __ldcg(b); });  // Note [Registers]
}

/// Block-wide: one step's channel `ch` (data: the step's bytes in this rank's buffer). False if
/// a wait failed.
template <typename T, RedOp kOp, bool kReduce>
__device__ bool runChannel(const SchedArgs& a, const Call& c, const exec::DeviceStep& s, uint32_t round, int lane,
                           int ch, char* data, uint64_t nbytes) {
  constexpr uint64_t kSliceVectors = kSchedSlotBytes / 16;
  const uint64_t nvec = (nbytes + 15) / 16;
  const uint64_t v0 = nvec * ch / kSchedChannels, v1 = nvec * (ch + 1) / kSchedChannels;
  if (v0 == v1) return true;  // so is the peer's, and a dep's: nothing to move or wait for
  const uint64_t slices = (v1 - v0 + kSliceVectors - 1) / kSliceVectors;
  const bool sends = s.kind == exec::kDeviceSend;
  char* own = a.peers.base[a.rank];
  char* peer = a.peers.base[s.peer];
  uint64_t* count = word(a, own, (sends ? kSchedOwnSent : kSchedOwnTaken) + s.peer * kSchedChannels + ch);
  uint64_t* progress = word(a, own, kSchedProgress + lane * kSchedChannels + ch);
  const bool aligned = isAligned(data);
  __shared__ uint64_t first;
  __shared__ int failed;
  if (threadIdx.x == 0) first = *reinterpret_cast<volatile uint64_t*>(count);
  __syncthreads();
  const uint64_t n0 = first;
  for (uint64_t j = 0; j < slices; ++j) {
    const uint64_t n = n0 + j;
    const uint64_t lo = v0 + j * kSliceVectors, hi = min(lo + kSliceVectors, v1);
    if (threadIdx.x == 0) {
      bool ok = sends ? n < kSchedSlots || waitAtLeast(a, word(a, own, kSchedFreed + s.peer * kSchedChannels + ch),
                                                       n + 1 - kSchedSlots, s.peer, c.seq, false)
                      : waitAtLeast(a, word(a, own, kSchedSent + s.peer * kSchedChannels + ch), n + 1, s.peer, c.seq,
                                    false);
      if (ok && s.dep >= 0)
        ok = waitAtLeast(a, word(a, own, kSchedProgress + s.dep * kSchedChannels + ch),
                         progressValue(c.seq, round, j + 1), a.rank, c.seq, true);
      if (ok && !sends) {
        const volatile SlotHeader* h = reinterpret_cast<const volatile SlotHeader*>(slotOf(a, own, s.peer, ch, n));
        if (h->tag != a.tag || h->step_bytes != nbytes) {
          recordFailure(a, s.peer, c.seq, 0, WaitFailure::kMismatch);
          ok = false;
        }
      }
      failed = !ok;
    }
    __syncthreads();
    if (failed) return false;
    if (sends) {
      char* slot = slotOf(a, peer, a.rank, ch, n);
      char* payload = slot + kSchedHeaderBytes;
      for (uint64_t v = lo + threadIdx.x; v < hi; v += kUnroll * blockDim.x) {
        uint4 x[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          x[u] = v + u * blockDim.x < hi ? loadBuf(data, v + u * blockDim.x, nbytes, aligned) : uint4{};
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (v + u * blockDim.x < hi) storeStaging(payload, v + u * blockDim.x - lo, x[u]);
      }
      if (threadIdx.x == 0) {
        volatile SlotHeader* h = reinterpret_cast<volatile SlotHeader*>(slot);
        h->tag = a.tag;
        h->step_bytes = nbytes;
      }
      __syncthreads();
      if (threadIdx.x == 0) publish(a.one_gpu, word(a, peer, kSchedSent + a.rank * kSchedChannels + ch), n + 1);
    } else {
      const char* payload = slotOf(a, own, s.peer, ch, n) + kSchedHeaderBytes;
      for (uint64_t v = lo + threadIdx.x; v < hi; v += kUnroll * blockDim.x) {
        uint4 x[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) x[u] = v + u * blockDim.x < hi ? loadPeer(payload, v + u * blockDim.x - lo) : uint4{};
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const uint64_t w = v + u * blockDim.x;
          if (w >= hi) continue;
          if constexpr (kReduce) {
            if (s.kind == exec::kDeviceRecvReduce) {
              Vec<T> acc;
              acc.set(loadBuf(data, w, nbytes, aligned));
              acc.template combine<kOp>(x[u]);
              x[u] = acc.get();
            }
          }
          storeUser(data, w, nbytes, aligned, x[u]);
        }
      }
      __syncthreads();
      // NOTE: the slot's loads are done (their values are stored), so the sender may reuse it.
      if (threadIdx.x == 0) publish(a.one_gpu, word(a, peer, kSchedFreed + a.rank * kSchedChannels + ch), n + 1);
    }
    if (threadIdx.x == 0) publish(true, progress, progressValue(c.seq, round, j + 1));
  }
  if (threadIdx.x == 0) *reinterpret_cast<volatile uint64_t*>(count) = n0 + slices;
  return true;
}

/// Block-wide: arrival `k` (from 1) of every block of this kernel at the barrier; waits for all
/// unless `last` (the kernel's end, where the last block to arrive moves the base on).
__device__ void gridBarrier(const SchedArgs& a, const Call& c, uint64_t base, uint64_t k, bool last) {
  __syncthreads();
  if (threadIdx.x == 0) {
    char* own = a.peers.base[a.rank];
    uint64_t* bar = word(a, own, kSchedBarrier);
    const uint64_t target = base + k * gridDim.x;
    __threadfence();
    const uint64_t before = atomicAdd(reinterpret_cast<unsigned long long*>(bar), 1ull);
    if (last) {
      if (before + 1 == target) *reinterpret_cast<volatile uint64_t*>(word(a, own, kSchedBarrierBase)) = target;
    } else {
      waitAtLeast(a, bar, target, a.rank, c.seq, true);  // a block that gave up still arrives
    }
  }
  __syncthreads();
}

template <typename T, RedOp kOp, bool kReduce>
__global__ void __launch_bounds__(kThreads) scheduleKernel(SchedArgs a) {
  const Call c = beginCall(a);
  char* own = a.peers.base[a.rank];
  __shared__ uint64_t base;
  if (threadIdx.x == 0) base = *reinterpret_cast<volatile uint64_t*>(word(a, own, kSchedBarrierBase));
  __syncthreads();
  const int lane = blockIdx.x / a.per_lane, sub = blockIdx.x % a.per_lane;
  bool ok = true;
  uint32_t begin = 0;
  for (uint32_t r = 0; r < a.rounds; ++r) {
    const uint32_t end = a.round_end[r];
    if (ok && begin + lane < end) {
      const exec::DeviceStep s = a.steps[begin + lane];
      const uint64_t lo = chunkAt(s.lo, a), hi = chunkAt(s.hi, a);
      for (int ch = sub; ok && ch < kSchedChannels; ch += a.per_lane)
        ok = runChannel<T, kOp, kReduce>(a, c, s, r, lane, ch, a.buf + lo, hi - lo);
    }
    begin = end;
    if (r + 1 < a.rounds) gridBarrier(a, c, base, r + 1, false);
  }
  // Note [Staging parity]: every peer's kernel of the previous call has ended before this one does.
  // (A failed wait is recorded for the host; the kernel ends either way.)
  const int q = threadIdx.x;
  if (blockIdx.x == 0 && ok && q < a.world && q != a.rank)
    waitAtLeast(a, reinterpret_cast<const uint64_t*>(&counterOf(a.peers.base[q])->seq), c.seq - 1, q, c.seq, false);
  gridBarrier(a, c, base, a.rounds == 0 ? 1 : a.rounds, true);
  endCall(a, c);
}

struct Sched {
  template <typename T, RedOp kOp>
  static void launch(const SchedArgs& a, int blocks, cudaStream_t s) {
    scheduleKernel<T, kOp, true><<<blocks, kThreads, 0, s>>>(a);
  }
};

}  // namespace

bool scheduleSupports(DType dtype, RedOp op) { return op == RedOp::kNone || directSupports(dtype, op); }

DeviceProgram uploadProgram(const exec::DeviceProgram& p) {
  DeviceProgram d;
  d.rounds = static_cast<uint32_t>(p.round_end.size());
  d.lanes = std::max<uint32_t>(p.lanes, 1);
  d.nchunks = p.nchunks;
  const size_t steps = p.steps.size() * sizeof(exec::DeviceStep);
  const size_t bytes = steps + p.round_end.size() * sizeof(uint32_t) + 16;
  cudaError_t e = cudaMalloc(&d.memory, bytes);
  if (e != cudaSuccess) throw Error(ErrorKind::kSystem, std::string("cudaMalloc (schedule): ") + cudaGetErrorString(e));
  char* m = static_cast<char*>(d.memory);
  const size_t at = (steps + 15) / 16 * 16;
  if (!p.steps.empty()) e = cudaMemcpy(m, p.steps.data(), steps, cudaMemcpyHostToDevice);
  if (e == cudaSuccess && !p.round_end.empty())
    e = cudaMemcpy(m + at, p.round_end.data(), p.round_end.size() * sizeof(uint32_t), cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    cudaFree(d.memory);
    throw Error(ErrorKind::kSystem, std::string("cudaMemcpy (schedule): ") + cudaGetErrorString(e));
  }
  d.steps = reinterpret_cast<const exec::DeviceStep*>(m);
  d.round_end = reinterpret_cast<const uint32_t*>(m + at);
  return d;
}

void freeProgram(DeviceProgram& p) {
  if (p.memory) cudaFree(p.memory);  // errors ignored: at exit the runtime may be gone
  p = DeviceProgram{};
}

uint64_t runSchedule(PeerTransport& t, const DeviceProgram& p, void* buf, uint64_t count, uint32_t elem, DType dtype,
                     RedOp op, uint64_t tag, cudaStream_t stream, uint64_t timeout_ns) {
  if (!scheduleSupports(dtype, op) || t.schedOffset() == 0 || elem == 0)
    throw Error(ErrorKind::kInvalid, "schedule executor called outside its limits");
  SchedArgs a{};
  beginCall(a, t, timeout_ns, KernelKind::kSchedule);
  a.steps = p.steps;
  a.round_end = p.round_end;
  a.rounds = p.rounds;
  a.nchunks = p.nchunks;
  a.sched_offset = t.schedOffset();
  a.buf = static_cast<char*>(buf);
  a.count = count;
  a.elem = elem;
  a.tag = tag;
  // NOTE: every block of the grid must be resident at once (lanes wait on each other and on
  // the barrier); the budget keeps all ranks' kernels resident together (Note [Block budget]).
  a.per_lane = static_cast<uint32_t>(std::clamp<int>(t.blockBudget() / static_cast<int>(p.lanes), 1, kSchedChannels));
  const int blocks = static_cast<int>(a.per_lane * p.lanes);
  if (op == RedOp::kNone) {
    scheduleKernel<uint8_t, RedOp::kSum, false><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    dispatch<Sched>(a, blocks, dtype, op, stream);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(ErrorKind::kSystem, std::string("schedule executor launch: ") + cudaGetErrorString(e));
  return a.launch;
}

}  // namespace tilecomm::cuda

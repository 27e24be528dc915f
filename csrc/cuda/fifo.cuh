// The schedule executor's FIFOs on the device (Note [Schedule executor] in schedule_executor.h):
// one step's channel moved slice by slice through the destination's slots, and the grid barrier.
// Shared by the executor's kernel and the all_to_all kernel (alltoall_fifo.cu).
#pragma once

#include "cuda/primitives.cuh"
#include "exec/device_schedule.h"

namespace tilecomm::cuda {

/// What the FIFO code reads of a kernel's arguments.
struct FifoArgs : CallArgs {
  uint64_t sched_offset;  // of the executor's region in every area
  uint64_t tag;           // the call's name, carried in every slot header
};

/// What a sender writes in front of a slice.
struct SlotHeader {
  uint64_t tag;
  uint64_t step_bytes;
};

__device__ __forceinline__ uint64_t* word(const FifoArgs& a, char* base, uint64_t w) {
  return reinterpret_cast<uint64_t*>(base + a.sched_offset) + w;
}

/// Slot n % kSchedSlots of the FIFO from `src` on channel `ch`, in the area at `base` (the destination's).
__device__ __forceinline__ char* slotOf(const FifoArgs& a, char* base, int src, int ch, uint64_t n) {
  const uint64_t fifo = static_cast<uint64_t>(src) * kSchedChannels + ch;
  return base + a.sched_offset + kSchedControlBytes + (fifo * kSchedSlots + n % kSchedSlots) * kSchedSlotStride;
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
__device__ inline bool waitAtLeast(const FifoArgs& a, const uint64_t* p, uint64_t want, int peer, uint64_t seq, bool local) {
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
/// a wait failed. With `announce`, channel 0 moves at least one slice (maybe empty), so that its
/// header tells the receiver the sender's size even where one side has nothing to move: where the
/// two sides' sizes come from their own arguments (all_to_all's splits), not from one schedule.
template <typename T, RedOp kOp, bool kReduce>
__device__ bool runChannel(const FifoArgs& a, const Call& c, const exec::DeviceStep& s, uint32_t round, int lane,
                           int ch, char* data, uint64_t nbytes, bool announce = false) {
  constexpr uint64_t kSliceVectors = kSchedSlotBytes / 16;
  const uint64_t nvec = (nbytes + 15) / 16;
  const uint64_t v0 = nvec * ch / kSchedChannels, v1 = nvec * (ch + 1) / kSchedChannels;
  const bool empty_slice = announce && ch == 0 && v0 == v1;
  if (v0 == v1 && !empty_slice) return true;  // so is the peer's, and a dep's: nothing to move or wait for
  const uint64_t slices = empty_slice ? 1 : (v1 - v0 + kSliceVectors - 1) / kSliceVectors;
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
__device__ inline void gridBarrier(const FifoArgs& a, const Call& c, uint64_t base, uint64_t k, bool last) {
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

/// Block-wide, at a kernel's start: the base of this call's grid barrier (gridBarrier).
__device__ __forceinline__ uint64_t barrierBase(const FifoArgs& a) {
  __shared__ uint64_t base;
  if (threadIdx.x == 0) base = *reinterpret_cast<volatile uint64_t*>(word(a, a.peers.base[a.rank], kSchedBarrierBase));
  __syncthreads();
  return base;
}

/// Block-wide, at a kernel's end (ok: this block's waits all held): Note [Staging parity], every
/// peer's kernel of the previous call has ended before this one does (a failed wait is recorded for
/// the host; the kernel ends either way); then the last arrival `k` at the grid barrier.
__device__ inline void endFifoKernel(const FifoArgs& a, const Call& c, uint64_t base, uint64_t k, bool ok) {
  const int q = threadIdx.x;
  if (blockIdx.x == 0 && ok && q < a.world && q != a.rank)
    waitAtLeast(a, reinterpret_cast<const uint64_t*>(&counterOf(a.peers.base[q])->done), c.seq - 1, q, c.seq, false);
  gridBarrier(a, c, base, k, true);
}

}  // namespace tilecomm::cuda

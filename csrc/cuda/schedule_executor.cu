// The schedule executor's kernel and host side (Note [Schedule executor] in schedule_executor.h).
#include "cuda/schedule_executor.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "cuda/allreduce.h"
#include "cuda/dispatch.cuh"
#include "cuda/fifo.cuh"

namespace tilecomm::cuda {

static_assert(kSchedLanes == exec::kDeviceMaxLanes, "one lane per step of a round");
static_assert(kSchedSlotBytes % 16 == 0 && kSchedHeaderBytes % 16 == 0, "slots hold whole vectors");

namespace {

struct SchedArgs : FifoArgs {
  const exec::DeviceStep* steps;
  const uint32_t* round_end;
  uint32_t rounds;
  uint32_t per_lane;  // thread blocks per lane
  uint32_t nchunks;
  char* buf;
  uint64_t count;
  uint32_t elem;
};

/// Byte offset of chunk c (exec::chunkOffset on the device).
__device__ __forceinline__ uint64_t chunkAt(uint64_t c, const SchedArgs& a) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(c) * a.count) / a.nchunks) * a.elem;
}

template <typename T, RedOp kOp, bool kReduce>
__global__ void __launch_bounds__(kThreads) scheduleKernel(SchedArgs a) {
  const Call c = beginCall<false, true>(a);  // endFifoKernel waits for the peers' counter.done
  const uint64_t base = barrierBase(a);
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
  endFifoKernel(a, c, base, a.rounds == 0 ? 1 : a.rounds, ok);
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

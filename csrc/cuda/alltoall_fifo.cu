// alltoall_fifo (CUDA, cuda_ipc or host_mapped): one round in which this rank sends block q of
// its input to every peer q and receives every peer's block for it, all at once, each on its own
// lane of thread blocks through the executor's FIFOs (fifo.cuh); lane 0 copies the own block.
// Cost: 1 round; per rank (p-1)/p of the input sent and the output received, each byte copied
// twice (into the peer's slot, out of it). Block sizes come from each side's own splits: channel
// 0 of every pair always carries a slot header (maybe with no data), so a peer that disagrees on
// a size fails the call naming it, even where one side has nothing to move.
#include "cuda/alltoall.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "cuda/fifo.cuh"

namespace tilecomm::cuda {

namespace {

struct AllToAllArgs : FifoArgs {
  AllToAllCall call;
  uint32_t per_lane;  // thread blocks per lane
};

int lanesOf(int world) { return 2 * world - 1; }

__global__ void __launch_bounds__(kThreads) allToAllKernel(AllToAllArgs a) {
  const Call c = beginCall<false, true>(a);  // endFifoKernel waits for the peers' counter.done
  const uint64_t base = barrierBase(a);
  const int lane = blockIdx.x / a.per_lane, sub = blockIdx.x % a.per_lane;
  bool ok = true;
  if (lane == 0) {  // the own block, over this lane's blocks
    const uint64_t n = a.call.out_bytes[a.rank];
    copyVectors(a.call.in[a.rank], a.call.out[a.rank], n,
                Walk{sub * blockDim.x + threadIdx.x, static_cast<uint64_t>(a.per_lane) * blockDim.x, (n + 15) / 16});
  } else {  // lanes 1..p-1 send to rank + k, lanes p..2p-2 receive from rank - k
    const bool sends = lane < a.world;
    const int k = sends ? lane : lane - a.world + 1;
    const int peer = sends ? (a.rank + k) % a.world : (a.rank - k + a.world) % a.world;
    const exec::DeviceStep s{static_cast<uint8_t>(sends ? exec::kDeviceSend : exec::kDeviceRecvCopy), -1,
                             static_cast<int16_t>(peer), 0, 0};
    char* data = sends ? const_cast<char*>(a.call.in[peer]) : a.call.out[peer];  // a send only reads it
    const uint64_t n = sends ? a.call.in_bytes[peer] : a.call.out_bytes[peer];
    for (int ch = sub; ok && ch < kSchedChannels; ch += a.per_lane)
      ok = runChannel<uint8_t, RedOp::kSum, false>(a, c, s, 0, lane, ch, data, n, /*announce=*/true);
  }
  endFifoKernel(a, c, base, 1, ok);
  endCall(a, c);
}

}  // namespace

bool allToAllFits(const PeerTransport& t) {
  const int lanes = lanesOf(t.world());
  return t.schedOffset() != 0 && lanes <= kSchedLanes && lanes <= t.blockBudget();
}

uint64_t allToAllFifo(PeerTransport& t, const AllToAllCall& call, uint64_t tag, cudaStream_t stream,
                      uint64_t timeout_ns) {
  if (!allToAllFits(t)) throw Error(ErrorKind::kInvalid, "alltoall_fifo called outside its limits");
  AllToAllArgs a{};
  beginCall(a, t, timeout_ns, KernelKind::kAllToAll);
  a.sched_offset = t.schedOffset();
  a.tag = tag;
  a.call = call;
  // NOTE: every block must be resident at once (the lanes of all ranks wait on each other);
  // allToAllFits keeps the grid within the budget.
  const int lanes = lanesOf(t.world());
  a.per_lane = static_cast<uint32_t>(std::clamp(t.blockBudget() / lanes, 1, kSchedChannels));
  allToAllKernel<<<static_cast<int>(a.per_lane) * lanes, kThreads, 0, stream>>>(a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(ErrorKind::kSystem, std::string("alltoall_fifo launch: ") + cudaGetErrorString(e));
  return a.launch;
}

}  // namespace tilecomm::cuda

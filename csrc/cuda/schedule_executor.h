// The schedule executor (CUDA): walks one rank's rounds of a scheduled algorithm (ring, tree,
// recursive doubling, Rabenseifner, hierarchical, the broadcast, reduce, gather, scatter,
// all_gather and reduce_scatter schedules; exec/device_schedule.h) inside one kernel, over the
// peer transport (cuda_ipc or host_mapped), on the buffer the CPU engine would run it over.
//
// Note [Schedule executor]:
// - Lanes: step i of a round runs on thread blocks [i * B, (i + 1) * B) of the grid, B from the
//   block budget, so a round's steps progress at once, as the CPU executor's do. A step's bytes
//   are cut into kSchedChannels channels of 16-byte vectors (the same cut on both sides: both
//   know the step's size); block b of a lane runs channels b, b + B, ...; a channel moves in
//   slices of kSchedSlotBytes.
// - FIFOs: every (source, destination, channel) has kSchedSlots slots in the destination's area.
//   The sender copies a slice from its buffer into the next slot, writes the slot's header (the
//   call's tag and the step's size) and raises sent[source][channel] in the destination's area;
//   the receiver, polling its own memory, checks the header, copies or reduces the slice into its
//   buffer and raises freed[destination][channel] in the sender's area, which frees the slot.
//   Counts only grow (the area is zeroed once) and each side keeps its own running count in its
//   area, so a kernel takes nothing per call from the host: it can be captured in a CUDA graph.
// - A step bounded by another one (dep: a forwarding send by the receive it forwards, a
//   receive-reduce by the send that must first copy the bytes out) waits, slice by slice, for
//   that step's lane to have done the slice; lanes publish (call, round, slices) words for this.
// - A grid barrier (every block of this rank's kernel) ends each round: the next may read what
//   this one received.
// - Note [Staging parity] holds across executor calls: a direct kernel's staging buffer may be
//   rewritten two calls later only because the call between waited for every peer's part; an
//   executor call need not talk to every peer, so before it ends it waits until every peer's
//   kernel of the previous call has ended (its device counter).
// - A header that does not match (another collective, size or algorithm on the peer) fails the
//   call naming the peer, as a timed-out or dead-peer wait does (KernelError).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/types.h"
#include "cuda/peer_transport.h"
#include "exec/device_schedule.h"

namespace tilecomm::cuda {

/// One rank's program in device memory (uploadProgram).
struct DeviceProgram {
  const exec::DeviceStep* steps = nullptr;
  const uint32_t* round_end = nullptr;
  uint32_t rounds = 0;
  uint32_t lanes = 0;
  uint32_t nchunks = 1;
  void* memory = nullptr;  // what freeProgram releases
};

/// Copies `p` into device memory of the current device (synchronously; not under capture).
DeviceProgram uploadProgram(const exec::DeviceProgram& p);
void freeProgram(DeviceProgram& p);

/// Whether the executor moves (op == kNone) or reduces `dtype` with `op`.
bool scheduleSupports(DType dtype, RedOp op);

/// Enqueues program `p` over count elements of elem bytes at `buf` (device memory of t's device)
/// on `stream`: op kNone moves data, other ops reduce dtype. `tag` names the call (collective,
/// algorithm, dtype, op, size): peers' headers must carry the same. Requires scheduleSupports()
/// and a transport with an executor region (not nvshmem). Every rank launches one kernel per
/// call, even with nothing to move (the calls' sequence numbers stay equal, Note [Device
/// sequence]). Returns the kernel's launch id.
uint64_t runSchedule(PeerTransport& t, const DeviceProgram& p, void* buf, uint64_t count, uint32_t elem, DType dtype,
                     RedOp op, uint64_t tag, cudaStream_t stream, uint64_t timeout_ns);

}  // namespace tilecomm::cuda

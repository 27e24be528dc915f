// Direct all_gather, reduce_scatter and all_reduce over the NVSHMEM peer
// transport (PeerMemory::kNvshmem): one kernel file per algorithm
// (allgather_nvshmem_push.cu, allgather_nvshmem_pull.cu,
// reducescatter_nvshmem_push.cu, reducescatter_nvshmem_pull.cu,
// allreduce_nvshmem_two_shot.cu) and this host side (blocks.cu), which cuts a
// call into pieces that fit the staging buffers.
//
// all_gather and reduce_scatter move one block of nbytes per pair of ranks:
// - push: rank r stores its block for q into slot r of q's staging buffer and
//   raises its push flag there (Note [Push flags]); q waits on its own memory,
//   then copies (all_gather) or reduces in rank order (reduce_scatter) the slots.
//   all_gather push first learns where each peer's output lies (destOf): one on
//   the symmetric heap is written in place and needs no copy (a small call
//   stages every output and skips that round: Note [Small calls]).
//   Peers without a peer address are reached with NVSHMEM's put-with-signal
//   from the host (`put_signal`), whose signal is the same push flag.
// - pull: rank r stages its input (or, if it lies on the symmetric heap, lets
//   peers read it in place: sourceOf()) and announces it; each q reads what it
//   needs from every peer, starting at a different peer, then says it is done
//   (phase 1); a rank read in place waits for that before its kernel ends.
// - all_reduce two-shot: a reduce_scatter pull whose result each rank stores
//   back into every rank's copy (in place on the heap, or staged), so that one
//   tensor on the heap on every rank moves only what the reduction must. Over
//   cuda_ipc it also runs on registered tensors (allReduceRegistered).
// Every kernel takes its sequence number from the device counter (Note
// [Device sequence]); the host counts calls too (put_signal needs the value).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/types.h"
#include "cuda/peer_transport.h"

namespace tilecomm::cuda {

enum class BlockAlgo : uint8_t {
  kAllGatherPush,
  kAllGatherPull,
  kReduceScatterPush,
  kReduceScatterPull,
  kAllReduceTwoShot,
};

/// "allgather_nvshmem_push", ...
const char* blockAlgoName(BlockAlgo a);

/// One call: all_gather reads in[0] and writes out[q] (rank q's block); reduce_scatter reads
/// in[q] (its block for rank q) and writes out[0]; all_reduce reads and writes in[0] == out[0]
/// (nbytes: the whole tensor). Every pointer is device memory of t's device.
struct BlockCall {
  const void* in[kMaxRanks] = {};
  void* out[kMaxRanks] = {};
  uint64_t nbytes = 0;       // bytes per block, > 0
  DType dtype = DType::kBytes;  // reduce_scatter, all_reduce
  RedOp op = RedOp::kNone;      // reduce_scatter, all_reduce
  bool in_contiguous = false;   // reduce_scatter: in[q] = in[0] + q * nbytes
};

/// Enqueues `call` on `stream` as one or more calls over `t` (nvshmem memory), each at most a
/// staging buffer's worth. put_signal (push only) moves the data with NVSHMEM's put-with-signal
/// instead of the kernels' stores (needed for peers without a peer address). Returns the last
/// kernel's launch id; *in_place says whether peers read this rank's input or write its output
/// in place (all_gather push into an output that is one range on the symmetric heap; all_reduce
/// of a tensor on the heap).
uint64_t runBlocks(BlockAlgo algo, PeerTransport& t, const BlockCall& call, bool put_signal, cudaStream_t stream,
                   uint64_t timeout_ns, bool* in_place);

/// Enqueues on `stream` the all_reduce two-shot over registered tensors (any peer memory whose
/// ranks reach each other's device memory: cuda_ipc): tensors[q] is rank q's tensor of nbytes
/// mapped into this process (tensors[rank] this rank's own), reduced in place in one kernel, with
/// no staging and no piece limit (Note [Registered tensors] in backend/cuda_glue.hpp). Returns the
/// kernel's launch id.
uint64_t allReduceRegistered(PeerTransport& t, char* const* tensors, uint64_t nbytes, DType dtype, RedOp op,
                             cudaStream_t stream, uint64_t timeout_ns);

/// The same for all_gather: rank q's output (world x nbytes, mapped here) is outputs[q]; each rank
/// stores its block `in` into block `rank` of every output (the push kernel, in place).
uint64_t allGatherRegistered(PeerTransport& t, const char* in, char* const* outputs, uint64_t nbytes,
                             cudaStream_t stream, uint64_t timeout_ns);

/// The same for all_to_all with equal blocks (alltoall_push.cu): in[q] is this rank's block for
/// rank q, outputs[q] rank q's output (world x nbytes, mapped here); each rank stores in[q] into
/// block `rank` of outputs[q], in place.
uint64_t allToAllRegistered(PeerTransport& t, const char* const* in, char* const* outputs, uint64_t nbytes,
                            cudaStream_t stream, uint64_t timeout_ns);

}  // namespace tilecomm::cuda

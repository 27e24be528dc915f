// all_to_all on the GPU (alltoall_fifo.cu): every pair at once through the schedule executor's
// FIFOs (Note [Schedule executor] in schedule_executor.h), with block sizes from the call's own
// arguments, so splits may differ per rank and per call. One kernel per call, taking nothing per
// call from the host beyond its arguments: it can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/peer_transport.h"

namespace tilecomm::cuda {

/// One call's blocks: in[q] (in_bytes[q]) goes to rank q; out[q] (out_bytes[q]) comes from rank q.
/// Rank q's in_bytes[r] must equal rank r's out_bytes[q]; a peer whose size differs fails the
/// call naming it. in and out must not overlap.
struct AllToAllCall {
  const char* in[kMaxRanks];
  char* out[kMaxRanks];
  uint64_t in_bytes[kMaxRanks];
  uint64_t out_bytes[kMaxRanks];
};

/// Whether the kernel can run over `t`: the transport has the executor's region (cuda_ipc,
/// host_mapped), and its 2 x world - 1 lanes (the own block's copy, a send and a receive per
/// peer), each at least one thread block, fit the block budget (Note [Block budget]). The same
/// answer on every rank: the group agrees on one budget when the transport comes up.
bool allToAllFits(const PeerTransport& t);

/// Enqueues the all_to_all on `stream`; requires allToAllFits(t). `tag` names the call (peers'
/// slot headers must carry the same). Returns the kernel's launch id.
uint64_t allToAllFifo(PeerTransport& t, const AllToAllCall& call, uint64_t tag, cudaStream_t stream,
                      uint64_t timeout_ns);

}  // namespace tilecomm::cuda

// Host side of the block kernels (blocks.h): checks, pieces, arguments, grid.
#include "cuda/blocks.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "cuda/allreduce.h"
#include "cuda/blocks_launch.cuh"
#include "cuda/nvshmem.h"

namespace tilecomm::cuda {

const char* blockAlgoName(BlockAlgo a) {
  switch (a) {
    case BlockAlgo::kAllGatherPush: return "allgather_nvshmem_push";
    case BlockAlgo::kAllGatherPull: return "allgather_nvshmem_pull";
    case BlockAlgo::kReduceScatterPush: return "reducescatter_nvshmem_push";
    case BlockAlgo::kReduceScatterPull: return "reducescatter_nvshmem_pull";
    case BlockAlgo::kAllReduceTwoShot: return "allreduce_nvshmem_two_shot";
  }
  return "?";
}

namespace {
// Note [Small calls]: an all_gather lets peers use a rank's input (pull) or output (push) in place
// on the symmetric heap, which costs a flag round: push announces where every output lies before
// any store, and a pull rank read in place waits until every peer is done (phase 1). Up to
// kSmallBytes per rank neither happens: every rank stages, push stores into slot `rank` of each
// peer's staging buffer straight away, as the reduce_scatter push does (Note [Staging parity] says
// why that slot is free), and pull reads peers' staging buffers without their source words and
// raises no phase 1. The staging copies, a few KiB of the GPU's own memory, cost less than the
// round (docs/benchmarks.md). Every rank decides from the call's size, so all agree.
constexpr uint64_t kSmallBytes = 64 << 10;

/// Thread blocks of a kernel whose walk spans `span` bytes (all_reduce: of each part; Note [Grid walk]).
// NOTE: the grid depends on the size only, so every rank's block b covers the same vectors and
// raises and waits on the same flags; the budget keeps all ranks' kernels resident.
// The simple kernels' grid (Note [Simple grid] in primitives.cuh); their memory is never host_mapped.
int gridFor(const PeerTransport& t, uint64_t span) { return simpleGrid((span + 15) / 16, t.blockBudget(), t.memory()); }

void checkLaunch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(ErrorKind::kSystem, std::string(what) + " launch: " + cudaGetErrorString(e));
}
}  // namespace

uint64_t runBlocks(BlockAlgo algo, PeerTransport& t, const BlockCall& call, bool put_signal, cudaStream_t stream,
                   uint64_t timeout_ns, bool* in_place) {
  const bool gather = algo == BlockAlgo::kAllGatherPush || algo == BlockAlgo::kAllGatherPull;
  const bool push = algo == BlockAlgo::kAllGatherPush || algo == BlockAlgo::kReduceScatterPush;
  const bool all = algo == BlockAlgo::kAllReduceTwoShot;
  const int p = t.world(), me = t.rank();
  // A piece's blocks, one slot per rank, fill at most one staging buffer (all_reduce: a piece of
  // the tensor, p parts of a slot each).
  const uint64_t piece = t.capacity() / p / 256 * 256 * (all ? p : 1);
  if (t.memory() != PeerMemory::kNvshmem || piece == 0 || call.nbytes == 0)
    throw Error(ErrorKind::kInvalid, std::string(blockAlgoName(algo)) + " called outside its limits");
  if (put_signal ? !push : !t.allDirect())
    throw Error(ErrorKind::kInvalid, std::string(blockAlgoName(algo)) +
                                         (put_signal ? " cannot use put-with-signal (only push algorithms can)"
                                                     : " needs a peer address of every rank's area (nvshmem_ptr)"));
  char* own = t.peers().base[me];
  // Peers read a pull rank's input in place when all of it lies on the symmetric heap (all_reduce:
  // and write it in place too); all_gather: unless the call is small (Note [Small calls]).
  const bool all_staged = gather && call.nbytes <= kSmallBytes;
  const uint64_t in_bytes = gather || all ? call.nbytes : p * call.nbytes;
  const bool read_in_place = !push && !all_staged && (gather || all || call.in_contiguous) &&
                             nvshmem::onHeap(call.in[0], in_bytes);
  // Peers write an all_gather push rank's output in place when it is one range on the heap.
  bool write_in_place = gather && push && !put_signal && !all_staged && nvshmem::onHeap(call.out[0], p * call.nbytes);
  for (int q = 1; write_in_place && q < p; ++q)
    write_in_place = call.out[q] == static_cast<char*>(call.out[0]) + q * call.nbytes;
  if (in_place) *in_place = read_in_place || write_in_place;
  BlockArgs a{};
  uint64_t launch = 0;
  for (uint64_t off = 0; off < call.nbytes; off += piece) {
    const uint64_t n = std::min(piece, call.nbytes - off);
    beginCall(a, t, timeout_ns,
              gather ? KernelKind::kAllGather : all ? KernelKind::kAllReduce : KernelKind::kReduceScatter);
    for (int q = 0; q < p; ++q) {
      a.in[q] = call.in[q] ? static_cast<const char*>(call.in[q]) + off : nullptr;
      a.out[q] = call.out[q] ? static_cast<char*>(call.out[q]) + off : nullptr;
    }
    a.nbytes = n;
    a.slot = (n + 255) / 256 * 256;
    a.stride = call.nbytes;
    if (all) a.slot = a.stride = ((n + p - 1) / p + 15) / 16 * 16;  // a part: at most a slot of the buffer
    a.source = read_in_place ? a.in[0] - own : kStagedSource;
    a.dest = write_in_place ? a.out[0] - own : kStagedSource;
    a.write = !put_signal;
    a.all_staged = all_staged;
    const int blocks = gridFor(t, all ? a.stride : n);
    const uint64_t s = t.nextCall();  // the kernel's own sequence number (Note [Device sequence])
    if (put_signal) {  // Note [Push flags]: NVSHMEM writes the data and then the flag of thread block 0
      char* slot = stagingOf(own, t.capacity(), s) + me * a.slot;  // symmetric: the same slot on every PE
      for (int i = 1; i < p; ++i) {
        const int q = (me + i) % p;
        nvshmem::putSignal(slot, gather ? a.in[0] : a.in[q], n, pushFlagOf(own, me, 0), s, q, stream);
      }
      nvshmem::quiet(stream);  // NOTE: a flag holds the last value set: call s + 1's may not land first
    }
    switch (algo) {
      case BlockAlgo::kAllGatherPush: launchAllGatherPush(a, blocks, stream); break;
      case BlockAlgo::kAllGatherPull: launchAllGatherPull(a, blocks, stream); break;
      case BlockAlgo::kReduceScatterPush: launchReduceScatterPush(a, blocks, call.dtype, call.op, stream); break;
      case BlockAlgo::kReduceScatterPull: launchReduceScatterPull(a, blocks, call.dtype, call.op, stream); break;
      case BlockAlgo::kAllReduceTwoShot: launchAllReduceNvshmemTwoShot(a, blocks, call.dtype, call.op, stream); break;
    }
    checkLaunch(blockAlgoName(algo));
    launch = a.launch;
  }
  return launch;
}

uint64_t allReduceRegistered(PeerTransport& t, char* const* tensors, uint64_t nbytes, DType dtype, RedOp op,
                             cudaStream_t stream, uint64_t timeout_ns) {
  const int p = t.world();
  if (nbytes == 0 || p > kMaxRanks || !directSupports(dtype, op))
    throw Error(ErrorKind::kInvalid, "allreduce_two_shot_registered called outside its limits");
  BlockArgs a{};
  beginCall(a, t, timeout_ns, KernelKind::kAllReduce);
  a.in[0] = a.out[0] = tensors[t.rank()];
  for (int q = 0; q < p; ++q) a.tensor[q] = tensors[q];
  a.nbytes = nbytes;
  a.slot = a.stride = ((nbytes + p - 1) / p + 15) / 16 * 16;  // a part
  a.source = kRegisteredSource;
  a.dest = kStagedSource;
  // Note [Registered parts]: this rank's part in whole vectors, aligned in every rank's tensor
  bool whole = partBytes(a, t.rank()) % 16 == 0;
  for (int q = 0; q < p; ++q) whole = whole && isAligned(tensors[q] + t.rank() * a.stride);
  if (whole) launchAllReduceRegisteredParts(a, gridFor(t, a.stride), dtype, op, stream);
  else launchAllReduceNvshmemTwoShot(a, gridFor(t, a.stride), dtype, op, stream);
  checkLaunch("allreduce_two_shot_registered");
  return a.launch;
}

uint64_t allGatherRegistered(PeerTransport& t, const char* in, char* const* outputs, uint64_t nbytes,
                             cudaStream_t stream, uint64_t timeout_ns) {
  const int p = t.world(), me = t.rank();
  if (nbytes == 0 || p > kMaxRanks) throw Error(ErrorKind::kInvalid, "allgather_push_registered called outside its limits");
  BlockArgs a{};
  beginCall(a, t, timeout_ns, KernelKind::kAllGather);
  a.in[0] = in;
  for (int q = 0; q < p; ++q) {
    a.out[q] = outputs[me] + q * nbytes;
    a.tensor[q] = outputs[q];
  }
  a.nbytes = nbytes;
  a.slot = (nbytes + 255) / 256 * 256;
  a.stride = nbytes;
  a.source = kStagedSource;
  a.dest = kRegisteredSource;
  a.write = true;
  launchAllGatherPush(a, gridFor(t, nbytes), stream);
  checkLaunch("allgather_push_registered");
  return a.launch;
}

uint64_t allToAllRegistered(PeerTransport& t, const char* const* in, char* const* outputs, uint64_t nbytes,
                            cudaStream_t stream, uint64_t timeout_ns) {
  const int p = t.world();
  if (nbytes == 0 || p > kMaxRanks) throw Error(ErrorKind::kInvalid, "alltoall_push_registered called outside its limits");
  BlockArgs a{};
  beginCall(a, t, timeout_ns, KernelKind::kAllToAll);
  for (int q = 0; q < p; ++q) {
    a.in[q] = in[q];
    a.tensor[q] = outputs[q];
  }
  a.nbytes = nbytes;
  a.stride = nbytes;
  a.source = a.dest = kRegisteredSource;
  launchAllToAllPush(a, gridFor(t, nbytes), stream);
  checkLaunch("alltoall_push_registered");
  return a.launch;
}

}  // namespace tilecomm::cuda

// Device primitives of the direct kernels: the call's sequence number from the
// device counter, flag signal/wait and LL lines with a timeout measured on the
// GPU, 16-byte loads and stores, and reduce<Op, T> over one 16-byte vector. No
// collective logic lives here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/types.h"
#include "cuda/peer_transport.h"

namespace tilecomm::cuda {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 16-byte vectors in flight per thread in the bandwidth loops

/// What every direct kernel gets (by value). Nothing in it changes between calls, so a kernel
/// captured in a CUDA graph can be replayed (Note [Device sequence]).
struct CallArgs {
  PeerTable peers;
  uint64_t capacity;     // bytes per staging buffer
  uint64_t ll_capacity;  // data bytes per rank slot of an LL buffer
  uint64_t timeout_ns;
  uint64_t launch;       // the host's launch id, recorded with a timeout
  KernelError* err;
  int rank;
  int world;
  KernelKind kind;
  bool one_gpu;  // Note [Fence scope]
};

/// The CallArgs of the next launch over `t` (host side; takes the launch id).
inline void beginCall(CallArgs& a, PeerTransport& t, uint64_t timeout_ns, KernelKind kind) {
  a.peers = t.peers();
  a.capacity = t.capacity();
  a.ll_capacity = t.llCapacity();
  a.timeout_ns = timeout_ns;
  a.launch = t.nextLaunch();
  a.err = t.errorForDevice();
  a.rank = t.rank();
  a.world = t.world();
  a.kind = kind;
  a.one_gpu = t.oneGpu();
}

/// all_reduce: the user's tensor, reduced in place.
struct DirectArgs : CallArgs {
  char* data;
  uint64_t nbytes;
};

/// all_gather: rank q's block lands at out[q]; this rank's input is `in`.
struct GatherArgs : CallArgs {
  const char* in;
  char* out[kMaxRanks];
  uint64_t nbytes;  // per rank
};

/// The block kernels (blocks.h): all_gather and reduce_scatter as blocks of `nbytes`, one per rank.
struct BlockArgs : CallArgs {
  const char* in[kMaxRanks];  // all_gather: in[0], this rank's block; reduce_scatter: in[q], its block for q
  char* out[kMaxRanks];       // all_gather: out[q] receives rank q's block; reduce_scatter: out[0]
  uint64_t nbytes;            // bytes per block (of this piece)
  uint64_t slot;              // distance between the blocks in a staging buffer (nbytes rounded up to 256)
  uint64_t stride;            // reduce_scatter read in place: distance between the input's blocks
  int64_t source;             // where peers read this rank's input: sourceOf() (kStagedSource: staged)
  int64_t dest;               // all_gather push: where peers write this rank's output: destOf()
  bool write;                 // push: the kernel stores the data into the peers (false: NVSHMEM put it there)
  bool all_staged;            // all_gather: every rank's input and output is staged (Note [Small calls])
  char* tensor[kMaxRanks];    // registered tensors (source or dest kRegisteredSource): rank q's, mapped here
};

// ---- time, the call's sequence number, flags ----

__device__ __forceinline__ uint64_t globalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void storeRelease(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t loadAcquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t loadRelaxed(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

/// After a relaxed poll saw a peer's release: what the peer published before it is visible to
/// this thread (and, through the block's barrier, to the others).
__device__ __forceinline__ void acquireFromPeers(bool one_gpu) {
  if (one_gpu) asm volatile("fence.acq_rel.gpu;" ::: "memory");
  else asm volatile("fence.acq_rel.sys;" ::: "memory");
}

// Note [Fence scope]: what a kernel publishes to its peers (a flag, its end-of-call counter)
// must follow every store it made into their areas, for whoever reads it: peers' kernels, and
// peers' host threads copying the counter in drain(). In general they are on other GPUs, or the
// areas are host memory, and the fence is system-scope. When every rank's area is memory of one
// GPU (cuda_ipc or NVSHMEM's heap with all ranks sharing that GPU: CallArgs::one_gpu), all those
// readers go through that GPU's memory, and a GPU-scope fence suffices; it is cheaper (measured
// in docs/benchmarks.md). Not where NVSHMEM's put-with-signal writes the flags a kernel waits
// on: NVSHMEM publishes those at its own scope. Waiters poll with system-scope relaxed loads and
// acquire at the same scope as the publisher released (Note [Release stores]).
//
// Note [Release stores]: the direct kernels publish a flag or their end of call with one release
// store by thread 0 after the block's barrier; the release is cumulative, so it also orders the
// other threads' stores the barrier ordered before it, and no separate fence precedes it. Waiters
// poll with relaxed loads and acquire once, with a fence, when the value has come. End of call:
// every block takes its count with an acquire-release atomic, so the last one's release of the
// counter follows every block's stores; a one-block kernel takes no count, and an awaited kernel's
// blocks count themselves at its start (Note [Awaited calls]). Against a fence before
// each release, acquire loads in the polls and a fenced atomic count, the registered two-shot took
// about 1 us less at 4 ranks and 0.5-0.8 us less at 2 up to 1 MiB (one H100, graph replay;
// docs/benchmarks.md). The schedule executor's FIFOs (fifo.cuh) still publish with a fence first.
__device__ __forceinline__ void fenceForPeers(bool one_gpu) {
  if (one_gpu) __threadfence();
  else __threadfence_system();
}

__device__ __forceinline__ void releaseToPeers(bool one_gpu, uint64_t* p, uint64_t v) {
  if (one_gpu) asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  else storeRelease(p, v);
}

/// Publishes v at p after every earlier store of the block (thread 0, after a barrier).
__device__ __forceinline__ void publish(bool one_gpu, uint64_t* p, uint64_t v) {
  fenceForPeers(one_gpu);
  releaseToPeers(one_gpu, p, v);
}

/// One block's view of the call (Note [Device sequence]).
struct Call {
  uint64_t seq;            // this call's sequence number
  uint64_t blocks_before;  // counter.blocks at the start: the blocks of every earlier kernel
  uint64_t before;         // an awaited kernel's thread 0: counter.arrived before this block's count
};

// Note [Awaited calls]: the count that ends a kernel of several blocks (endCall) costs its last
// block a round trip to memory after its work: an atomic whose result says whether it is the last,
// and only then counter.seq and counter.done. An awaited kernel is one whose every access to a
// peer's memory comes before (or is) a store that the peer's kernel of the same call waits for
// before it ends (the LL kernels' lines, the two-shot's push flags). It needs no such count at its
// end. When its own kernel has ended, every peer is done with its memory (drain), and a later
// call's kernel starts only after this one has ended (one stream). So each block counts itself at
// the start, right after reading the counter; the atomic's result is needed only at its end. The
// last block to be counted stores counter.seq there (every block has read it by then). counter.done
// is published by the next awaited or FIFO kernel's block 0 at its start (beginCall), or at the end
// of the next other kernel; drain reads it and waits for the call before its own last. A kernel
// that reads a peer's memory (a staging buffer, a flag) after its last wait is not awaited: the
// peer could end, tear down and free that memory first. NOTE: the ranks of one call run awaited
// kernels or none of them (both two-shot kernels are awaited; LL is chosen by size, the same on
// every rank): after an awaited call a rank's counter.done is one call behind, so a peer that ran a
// kernel not awaited would wait in drain for a value that never comes, until its timeout. Measured
// against main before (the count at the end, phase 1 with flags, no early load; one H100, graph
// replay, kernel time, float32, 3 pairs of rounds; docs/benchmarks.md, "Awaited calls adopted"):
// the registered two-shot 0.24-0.90 us less at 2 and 4 ranks, 4 KiB-1 MiB, the LL all_reduce
// 0.32-0.88 us less at 4 and 64 KiB; by latency at 4 ranks, 4 and 8 KiB, the LL all_reduce
// 0.69-1.13 us and the LL all_gather 0.59-0.71 less, and the LL all_reduce below the simple
// one_shot in every round (SymmetricMemory's one_shot, unchanged, moved by up to 0.93 between
// builds). The unchanged kernels' own time moved by -0.16 to +0.10 us.

/// Block-wide, at the kernel's start: this call's sequence number from the device counter.
/// kAwaited: each block counts itself now (Note [Awaited calls]). kPublishDone (awaited kernels,
/// and the FIFO kernels, whose end waits for the peers' counter.done): block 0 publishes
/// counter.done = the previous call (its kernel has ended). Other kernels publish it at their end
/// only, which saves them the store's registers (a spill in the simple two-shot's instances).
template <bool kAwaited = false, bool kPublishDone = kAwaited>
__device__ __forceinline__ Call beginCall(const CallArgs& a) {
  __shared__ uint64_t start[2];
  Call c{};
  if (threadIdx.x == 0) {
    SeqCounter* k = counterOf(a.peers.base[a.rank]);
    uint64_t seq, blocks;
    if (kAwaited) {  // one load for both; the acquire orders the count below after it
      asm volatile("ld.acquire.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(seq), "=l"(blocks) : "l"(&k->seq) : "memory");
    } else {  // counted at the end, after all its work: no order needed here
      const volatile SeqCounter* v = k;
      seq = v->seq;
      blocks = v->blocks;
    }
    start[0] = seq + 1;
    start[1] = blocks;
    if (kPublishDone && blockIdx.x == 0) *reinterpret_cast<volatile unsigned long long*>(&k->done) = seq;
    if (kAwaited && gridDim.x > 1) c.before = atomicAdd(&k->arrived, 1ull);
  }
  __syncthreads();
  c.seq = start[0];
  c.blocks_before = start[1];
  return c;
}

/// Block-wide, at the kernel's end (also after a timeout): the last block to be counted stores
/// counter.seq = call.seq, and (not kAwaited) counter.done. NOTE: every block must call it exactly
/// once, with the beginCall's kAwaited.
// NOTE: peers read counter.done from other processes in drain() before freeing their areas, so
// this kernel's stores into their areas must be visible before it (Note [Fence scope]).
template <bool kAwaited = false>
__device__ __forceinline__ void endCall(const CallArgs& a, const Call& c) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  SeqCounter* k = counterOf(a.peers.base[a.rank]);
  auto store = [](unsigned long long& field, uint64_t v) { *reinterpret_cast<volatile unsigned long long*>(&field) = v; };
  uint64_t* done = reinterpret_cast<uint64_t*>(&k->done);
  if (gridDim.x == 1) {  // the only block: no count to take
    store(k->arrived, c.blocks_before + 1);
    store(k->blocks, c.blocks_before + 1);
    store(k->seq, c.seq);
    if (!kAwaited) releaseToPeers(a.one_gpu, done, c.seq);
    return;
  }
  if (kAwaited) {  // counted at the start
    if (c.before + 1 == c.blocks_before + gridDim.x) {
      store(k->blocks, c.before + 1);
      store(k->seq, c.seq);
    }
    return;
  }
  // Note [Release stores]: the count releases this block's stores and acquires the earlier blocks'
  unsigned long long before;
  asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;" : "=l"(before) : "l"(&k->arrived) : "memory");
  if (before + 1 == c.blocks_before + gridDim.x) {  // every block of this kernel is done
    store(k->blocks, before + 1);
    store(k->seq, c.seq);
    releaseToPeers(a.one_gpu, done, c.seq);
  }
}

/// Records the first failed wait (which rank, which call, why, which block and what it last read)
/// for the host.
__device__ __forceinline__ void recordFailure(const CallArgs& a, int peer, uint64_t seq, uint64_t waited,
                                              WaitFailure why, Seen kind = Seen::kNothing, uint64_t seen = 0) {
  if (atomicCAS_system(&a.err->claimed, 0u, 1u) != 0u) return;
  a.err->block = static_cast<int>(blockIdx.x);
  a.err->seen_kind = static_cast<int>(kind);
  a.err->seen = seen;
  a.err->peer = peer;
  a.err->kind = static_cast<int>(a.kind);
  a.err->reason = static_cast<int>(why);
  a.err->seq = seq;
  a.err->launch = a.launch;
  a.err->waited_ns = waited;
  __threadfence_system();
  atomicExch_system(&a.err->ready, 1u);
}

/// Note [GPU watchdog]: whether a wait of call `seq` that started at `start` must give up (timeout,
/// or the host saw a peer die); records why. Called every few hundred polls: it reads host memory.
/// Once a wait of the call has failed, the call's other waits give up too, without a record: blocks
/// that became resident only after others had waited (too many for the GPU at once) would each
/// wait out a timeout of their own, wave after wave. Later calls still wait theirs: one that gave
/// up at once could go on to overwrite a staging buffer that a healthy peer is still reading
/// (Note [Staging parity]).
__device__ __forceinline__ bool waitFailed(const CallArgs& a, int peer, uint64_t seq, uint64_t start,
                                           Seen kind = Seen::kNothing, uint64_t seen = 0) {
  if (*reinterpret_cast<volatile unsigned int*>(&a.err->ready) != 0u) {
    __threadfence_system();  // the record's fields were written before `ready`
    if (*reinterpret_cast<volatile unsigned long long*>(&a.err->seq) == seq) return true;
  }
  const unsigned int dead = *reinterpret_cast<volatile unsigned int*>(&a.err->dead_ranks);
  const uint64_t waited = globalTimer() - start;
  if (dead != 0) {
    recordFailure(a, __ffs(dead) - 1, seq, waited, WaitFailure::kPeerDied);
    return true;
  }
  if (waited > a.timeout_ns) {
    recordFailure(a, peer, seq, waited, WaitFailure::kTimeout, kind, seen);
    return true;
  }
  return false;
}

/// Block-wide: once every thread's earlier stores are done, announces `seq` on this block's flag.
__device__ __forceinline__ void signal(const CallArgs& a, int phase, uint64_t seq) {
  __syncthreads();
  if (threadIdx.x == 0) releaseToPeers(a.one_gpu, flagOf(a.peers.base[a.rank], phase, blockIdx.x), seq);
}

/// Block-wide: waits until flagFor(q) >= seq for every peer q (thread q polls it). Returns false
/// (the same in every thread) if a wait outlasted the timeout or a peer died; the first failing
/// thread records why.
template <typename FlagFor>
__device__ __forceinline__ bool waitEach(const CallArgs& a, uint64_t seq, FlagFor flagFor) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const int q = threadIdx.x;
  if (q < a.world && q != a.rank) {
    const uint64_t* f = flagFor(q);
    const uint64_t start = globalTimer();
    uint32_t polls = 0;
    uint64_t v;
    while ((v = loadRelaxed(f)) < seq) {  // Note [Release stores]: the acquire follows
      if (++polls > 256) {
        __nanosleep(100);
        if (polls % 256 == 0 && waitFailed(a, q, seq, start, Seen::kFlag, v)) {
          failed = 1;
          break;
        }
      }
    }
    acquireFromPeers(a.one_gpu);
  }
  __syncthreads();
  return failed == 0;
}

/// Block-wide: waits until every peer announced `seq` for this block and phase (polling the peers).
__device__ __forceinline__ bool waitPeers(const CallArgs& a, int phase, uint64_t seq) {
  return waitEach(a, seq, [&](int q) { return flagOf(a.peers.base[q], phase, blockIdx.x); });
}

/// Block-wide: waits until every peer's data of call `seq` is in this rank's staging buffer (Note
/// [Push flags]; polling its own memory). `block`: the flag's thread block (0 after put-with-signal).
__device__ __forceinline__ bool waitPushed(const CallArgs& a, uint64_t seq, int block) {
  char* own = a.peers.base[a.rank];
  return waitEach(a, seq, [&](int q) { return pushFlagOf(own, q, block); });
}

/// Block-wide: once every thread's earlier stores are done, raises this rank's push flag of this
/// block in every peer's area (Note [Push flags]), thread i - 1 that of peer rank + i: the release
/// stores go out at once (Note [Release stores]: each is cumulative over the block's barrier).
__device__ __forceinline__ void signalPushed(const CallArgs& a, uint64_t seq) {
  __syncthreads();
  const int i = static_cast<int>(threadIdx.x) + 1;
  if (i < a.world)
    releaseToPeers(a.one_gpu, pushFlagOf(a.peers.base[(a.rank + i) % a.world], a.rank, blockIdx.x), seq);
}

// ---- LL lines ----
//
// Note [LL lines]: the low-latency protocol sends data without a separate flag
// round. A 16-byte line {d0, f, d1, f} carries 8 data bytes, each 4-byte word
// next to a copy of the flag f = llFlag(seq), and is written with one 16-byte
// store; a receiver polls its own memory until both flags of the line equal f,
// and then its data is there (each 8-byte half is written as a unit). Lines are
// never cleared: call s writes LL buffer s % 2 (Note [Staging parity]), whose
// lines still carry flags of call s - 2 or older, which differ from f.

/// The flag of call seq: never 0 (a line never written); repeats only every 2^32 - 1 calls.
__device__ __forceinline__ uint32_t llFlag(uint64_t seq) { return static_cast<uint32_t>(seq % 0xffffffffull) + 1u; }

__device__ __forceinline__ void llStoreLine(uint4* line, uint32_t d0, uint32_t d1, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(d0), "r"(flag), "r"(d1),
               "r"(flag)
               : "memory");
}

__device__ __forceinline__ uint4 llLoadLine(const uint4* line) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(line)
               : "memory");
  return v;
}

/// Sends 16-byte vector v as lines 2v and 2v + 1 of an LL slot.
__device__ __forceinline__ void llSend(char* slot, uint64_t v, uint4 x, uint32_t flag) {
  uint4* lines = reinterpret_cast<uint4*>(slot) + 2 * v;
  llStoreLine(lines, x.x, x.y, flag);
  llStoreLine(lines + 1, x.z, x.w, flag);
}

/// Note [LL grid]: an LL thread carries one vector at a time, and a small LL call over GPU memory
/// takes as long as its busiest SM needs to store and poll its lines: at 4 ranks sharing an
/// H200, 16 KiB on 2 blocks of kThreads took as long as 64 KiB on 8 (6.6 and 6.8 us, graph
/// replay). So over cuda_ipc the LL kernels spread the vectors over as many blocks of the budget
/// as there are warps of them, and widen the blocks (a warp at a time, up to kThreads) only once
/// every block of the budget is in use: 4.8 and 5.5 us. Over host_mapped, where every line
/// crosses PCIe, spreading made LL from 1 KiB slower (16 KiB at 2 ranks: 17.8 us on 2 blocks,
/// 101 us on 32), so there the blocks stay full (kThreads) and are as few as cover the vectors.
/// Up to kLLOneBlock vectors over GPU memory, or while a rank receives at most kThreads vectors
/// from its peers (8 KiB: up to 8 KiB at 2 ranks), one block with a warp per 32 vectors instead.
/// Spread a warp per block, 1-4 KiB took 0.2-1.1 us longer than on one block at 2 and 4 ranks,
/// and 8 KiB 0.6 us longer at 2; but 8 KiB at 4 ranks (24 KiB from the peers) took 1.3 us longer
/// on one block than spread (one H100, graph replay; docs/benchmarks.md, "One LL block up to 4
/// KiB" and "One LL block up to 8 KiB at two ranks"). Putting 4 and 8 KiB at 4 ranks on 2 and 3
/// blocks instead (a block's received vectors within kThreads) gained nothing beyond the noise
/// (one H100, graph replay; docs/benchmarks.md, "The registered two-shot's whole parts in a kernel
/// of their own; LL on a few blocks at world 4").
constexpr uint64_t kLLOneBlock = 256;  // vectors: 4 KiB of data
struct LLGrid {
  int blocks;
  int threads;
};

inline LLGrid llGrid(uint64_t nvec, int world, int budget, PeerMemory memory) {
  const uint64_t most = std::max(budget, 1);
  if (memory == PeerMemory::kHostMapped)
    return {static_cast<int>(std::clamp<uint64_t>((nvec + kThreads - 1) / kThreads, 1, most)), kThreads};
  const bool one = nvec <= kLLOneBlock || nvec * std::max(world - 1, 1) <= kThreads;
  const uint64_t blocks = one ? 1 : std::clamp<uint64_t>((nvec + 31) / 32, 1, most);
  const uint64_t warps = ((nvec + blocks - 1) / blocks + 31) / 32;
  return {static_cast<int>(blocks), static_cast<int>(std::clamp<uint64_t>(warps * 32, 32, kThreads))};
}

/// Note [Simple grid]: the simple kernels' and the block kernels' grid over nvec 16-byte vectors.
/// Over GPU memory a block per kThreads vectors (8 KiB), up to the budget. With a block per 128 KiB,
/// one SM did all of a call up to 128 KiB: on one H100 with 4 ranks, one_shot took 14.1 us at 256
/// KiB and 7.4 with the wider grid, and the registered two-shot (a block per 128 KiB of a part) 25.7
/// and 25.5 us at 1 and 4 MiB against 13.5 and 17.0 (graph replay; docs/benchmarks.md). Over
/// host_mapped, where every load crosses PCIe, the blocks stay few (a block per 128 KiB), as the LL
/// ones do.
inline int simpleGrid(uint64_t nvec, int budget, PeerMemory memory) {
  const uint64_t per_block = memory == PeerMemory::kHostMapped ? 4 * kUnroll * kThreads : kThreads;
  return static_cast<int>(std::clamp<uint64_t>((nvec + per_block - 1) / per_block, 1, std::max(budget, 1)));
}

/// Note [LL batches]: a receiver that polled its peers in turn paid one round trip to memory per
/// peer even when every line was there. llRecvBatch issues the loads of up to kLLBatch peers'
/// lines together (one round trip for all of them), then polls again only those not yet arrived.
/// Four peers' lines (two 16-byte lines each) stay in registers in the LL kernels, which launch at
/// most one block per SM of the budget (Note [Block budget]) and so may take up to 128 registers a
/// thread; at eight ranks a vector takes two round trips. NOTE: a full block of kThreads then fills
/// an SM's register file, so the ranks' LL grids at the full budget need every SM to themselves,
/// the demand at which the simple kernels' doubled grids were seen to hang at eight ranks (the
/// LL tests at eight ranks pass; docs/benchmarks.md, "One block per SM again").
constexpr int kLLBatch = 4;

/// Waits for vector v from ranks q0 .. q0 + kLLBatch - 1 (those below world) and puts it into
/// out[0 ..]: the peers' from their LL slots in this rank's own buffer `own`, `mine` for this rank
/// (and for ranks past the world). Returns false if the wait outlasted the timeout or a peer died
/// (recorded for the host).
__device__ __forceinline__ bool llRecvBatch(const CallArgs& a, char* own, uint64_t v, uint64_t seq, int q0,
                                            const uint4& mine, uint4 (&out)[kLLBatch]) {
  const uint32_t flag = llFlag(seq);
  const uint4* lines[kLLBatch];
  unsigned pending = 0;
#pragma unroll
  for (int i = 0; i < kLLBatch; ++i) {
    const int q = q0 + i;
    lines[i] = nullptr;
    out[i] = mine;
    if (q >= a.world || q == a.rank) continue;
    lines[i] = reinterpret_cast<const uint4*>(llSlotOf(own, a.capacity, a.ll_capacity, a.world, seq, q)) + 2 * v;
    pending |= 1u << i;
  }
  uint64_t start = 0;
  for (uint32_t polls = 1; pending != 0; ++polls) {
    uint4 p0[kLLBatch], p1[kLLBatch];
#pragma unroll
    for (int i = 0; i < kLLBatch; ++i) {  // every load first: they fly together
      if ((pending >> i & 1u) == 0) continue;
      p0[i] = llLoadLine(lines[i]);
      p1[i] = llLoadLine(lines[i] + 1);
    }
#pragma unroll
    for (int i = 0; i < kLLBatch; ++i) {
      if ((pending >> i & 1u) == 0) continue;
      if (p0[i].y == flag && p0[i].w == flag && p1[i].y == flag && p1[i].w == flag) {
        out[i] = make_uint4(p0[i].x, p0[i].z, p1[i].x, p1[i].z);
        pending &= ~(1u << i);
      }
    }
    if (pending != 0 && polls % 1024 == 0) {
      uint32_t seen = 0;  // the first pending peer's line's flag word (constant indices: registers)
#pragma unroll
      for (int i = kLLBatch - 1; i >= 0; --i)
        if (pending >> i & 1u) seen = p0[i].y;
      if (start == 0) start = globalTimer();
      else if (waitFailed(a, q0 + __ffs(static_cast<int>(pending)) - 1, seq, start, Seen::kLLFlag, seen)) return false;
    }
  }
  return true;
}

// ---- the grid's walk over a range of vectors ----
//
// Note [Grid walk]: the bandwidth loops sweep a range of 16-byte vectors with the whole grid
// together, as a memcpy kernel does: thread t of block b takes the vectors whose index is
// congruent to b x blockDim + t modulo the grid's thread count, kUnroll of them per step. They
// used to give each block one contiguous range instead; with every rank's kernel on one GPU that
// keeps a few hundred far-apart streams open in HBM at once, and the same loops ran at 2.9 TB/s
// on the H200 where the sweep ran at 3.8 (benchmarks/hbm_probe.cu; docs/benchmarks.md).
// Which vectors a thread owns depends only on the grid and on the vector's index, never on where
// a walk starts, so block b of every rank owns the same vectors of any range (the grid depends on
// the size alone: gridFor), and a walk over a part of a range visits exactly block b's vectors in
// that part: per-block flags keep meaning "block b's vectors are there".

/// This thread's vectors of [lo, hi): first, first + step, ... below end.
struct Walk {
  uint64_t first;  // this thread's first vector at or above lo
  uint64_t step;   // the grid's thread count
  uint64_t end;    // hi
};

__device__ __forceinline__ Walk walkOf(uint64_t lo, uint64_t hi) {
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t first = lo / step * step + static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first < lo) first += step;
  return Walk{first, step, hi};
}

/// The same walk stopped at `end` (at most w.end).
__device__ __forceinline__ Walk clipped(const Walk& w, uint64_t end) { return Walk{w.first, w.step, min(w.end, end)}; }

// ---- 16-byte vectors ----

__host__ __device__ __forceinline__ bool isAligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Note [Registers]: a vector is never addressed byte by byte through memory. A byte loop over
// `reinterpret_cast<char*>(&x)[i]` with a run-time i puts x in local memory, and the compiler
// then stored every vector there before testing whether the byte path runs: one more 16-byte
// local store per 16-byte global access, in memory that the 1024 threads of an SM share with the
// L1. It cost the bandwidth kernels 10-40% of their time at 64-256 MiB (docs/benchmarks.md). The
// helpers below unroll the byte loop over constant indices and build or split the vector with
// shifts, so it stays in registers. `nvcc -Xptxas -v` prints a kernel's stack frame; the
// `ld.local` / `st.local` of its PTX show what uses it.

/// Word k (a constant after unrolling) of x.
__device__ __forceinline__ uint32_t wordOf(const uint4& x, int k) {
  return k == 0 ? x.x : k == 1 ? x.y : k == 2 ? x.z : x.w;
}

/// The first min(len, 16) bytes of a vector read one by one with load(byte address), the rest zero.
template <typename Load>
__device__ __forceinline__ uint4 loadBytes(const char* p, uint64_t len, Load load) {
  uint32_t w0 = 0, w1 = 0, w2 = 0, w3 = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    if (static_cast<uint64_t>(i) >= len) break;
    const uint32_t b = static_cast<uint32_t>(static_cast<uint8_t>(load(p + i))) << (8 * (i % 4));
    if (i < 4) w0 |= b;
    else if (i < 8) w1 |= b;
    else if (i < 12) w2 |= b;
    else w3 |= b;
  }
  return make_uint4(w0, w1, w2, w3);
}

/// The first min(len, 16) bytes of x stored one by one.
__device__ __forceinline__ void storeBytes(char* p, uint64_t len, const uint4& x) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    if (static_cast<uint64_t>(i) >= len) break;
    p[i] = static_cast<char>(wordOf(x, i / 4) >> (8 * (i % 4)));
  }
}

/// Bytes of vector v that lie below nbytes (0..16).
__device__ __forceinline__ uint64_t bytesOf(uint64_t v, uint64_t nbytes) {
  const uint64_t off = v * 16;
  return off >= nbytes ? 0 : min(nbytes - off, static_cast<uint64_t>(16));
}

/// Vector v of the user's buffer; bytes past nbytes read as zero.
__device__ __forceinline__ uint4 loadUser(const char* p, uint64_t v, uint64_t nbytes, bool aligned) {
  const uint64_t off = v * 16;
  if (aligned && off + 16 <= nbytes) return *reinterpret_cast<const uint4*>(p + off);
  return loadBytes(p + off, bytesOf(v, nbytes), [](const char* b) { return *b; });
}

/// Writes vector v into the user's buffer, never past nbytes.
__device__ __forceinline__ void storeUser(char* p, uint64_t v, uint64_t nbytes, bool aligned, uint4 x) {
  const uint64_t off = v * 16;
  if (aligned && off + 16 <= nbytes) {
    *reinterpret_cast<uint4*>(p + off) = x;
    return;
  }
  storeBytes(p + off, bytesOf(v, nbytes), x);
}

/// A peer's staging vector: 16-byte load cached in L2 only (peers write it between calls).
__device__ __forceinline__ uint4 loadPeer(const char* staging, uint64_t v) {
  return __ldcg(reinterpret_cast<const uint4*>(staging) + v);
}
/// Vector v of a buffer another rank wrote this call (any alignment; bytes past nbytes read as
/// zero): 16-byte loads cached in L2 only where it can.
__device__ __forceinline__ uint4 loadFrom(const char* p, uint64_t v, uint64_t nbytes) {
  const uint64_t off = v * 16;
  if ((reinterpret_cast<uintptr_t>(p) & 15) == 0 && off + 16 <= nbytes) return loadPeer(p, v);
  return loadBytes(p + off, bytesOf(v, nbytes), [](const char* b) { return *b; });
}

__device__ __forceinline__ void storeStaging(char* staging, uint64_t v, uint4 x) {
  __stcg(reinterpret_cast<uint4*>(staging) + v, x);
}

/// This thread's vectors of walk w of nbytes at `src` (this rank's input, or written by another
/// rank this call: loads bypass L1) copied to `dst` (any alignment), kUnroll loads in flight per thread.
__device__ __forceinline__ void copyVectors(const char* src, char* dst, uint64_t nbytes, const Walk& w) {
  const bool aligned = isAligned(dst);
  for (uint64_t v = w.first; v < w.end; v += kUnroll * w.step) {
    uint4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = v + u * w.step < w.end ? loadFrom(src, v + u * w.step, nbytes) : uint4{};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (v + u * w.step < w.end) storeUser(dst, v + u * w.step, nbytes, aligned, x[u]);
  }
}

/// This thread's vectors of walk w of the user's buffer copied into a staging buffer, kUnroll
/// loads in flight per thread.
__device__ __forceinline__ void stageVectors(const DirectArgs& a, char* staging, const Walk& w, bool aligned) {
  for (uint64_t v = w.first; v < w.end; v += kUnroll * w.step) {
    uint4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      x[u] = v + u * w.step < w.end ? loadUser(a.data, v + u * w.step, a.nbytes, aligned) : uint4{};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (v + u * w.step < w.end) storeStaging(staging, v + u * w.step, x[u]);
  }
}

// ---- reduce<Op, T> ----

template <typename T>
struct Acc {
  using type = T;
  __device__ static T widen(T x) { return x; }
  __device__ static T narrow(T x) { return x; }
};
template <>
struct Acc<__half> {
  using type = float;
  __device__ static float widen(__half x) { return __half2float(x); }
  __device__ static __half narrow(float x) { return __float2half_rn(x); }
};
template <>
struct Acc<__nv_bfloat16> {
  using type = float;
  __device__ static float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 narrow(float x) { return __float2bfloat16_rn(x); }
};

template <typename T>
struct Unsigned {
  using type = T;
};
template <>
struct Unsigned<int8_t> {
  using type = uint8_t;
};
template <>
struct Unsigned<int16_t> {
  using type = uint16_t;
};
template <>
struct Unsigned<int32_t> {
  using type = uint32_t;
};
template <>
struct Unsigned<int64_t> {
  using type = unsigned long long;
};

template <typename T>
constexpr bool kIsFloat = std::is_floating_point_v<T>;

/// The canonical quiet NaN, as the CPU engine returns it from MIN/MAX.
template <typename A>
__device__ __forceinline__ A quietNaN() {
  if constexpr (std::is_same_v<A, double>) return __longlong_as_double(0x7ff8000000000000ll);
  else return __int_as_float(0x7fc00000);
}

/// op(a, b) with the CPU engine's semantics (kernels/reduce.cc): integers wrap, bool SUM/MAX
/// are OR and PRODUCT/MIN are AND, MIN/MAX propagate NaN and order -0 below +0.
template <RedOp kOp, typename A>
__device__ __forceinline__ A apply(A a, A b) {
  if constexpr (kOp == RedOp::kSum) {
    if constexpr (std::is_same_v<A, bool>) return a || b;
    else if constexpr (std::is_integral_v<A>) {
      using U = typename Unsigned<A>::type;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else return a + b;
  } else if constexpr (kOp == RedOp::kProduct) {
    if constexpr (std::is_same_v<A, bool>) return a && b;
    else if constexpr (std::is_integral_v<A>) {
      using U = typename Unsigned<A>::type;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else return a * b;
  } else if constexpr (kOp == RedOp::kMin) {
    if constexpr (kIsFloat<A>) {
      if (a != a || b != b) return quietNaN<A>();
      if (a == b) return signbit(a) ? a : b;
    }
    return b < a ? b : a;
  } else if constexpr (kOp == RedOp::kMax) {
    if constexpr (kIsFloat<A>) {
      if (a != a || b != b) return quietNaN<A>();
      if (a == b) return signbit(a) ? b : a;
    }
    return b > a ? b : a;
  } else if constexpr (kOp == RedOp::kBand) {
    return static_cast<A>(a & b);
  } else if constexpr (kOp == RedOp::kBor) {
    return static_cast<A>(a | b);
  } else {
    return static_cast<A>(a ^ b);
  }
}

/// One 16-byte vector widened to the accumulation type.
template <typename T>
struct Vec {
  static constexpr int kN = 16 / sizeof(T);
  using A = typename Acc<T>::type;
  A x[kN];

  __device__ __forceinline__ void set(uint4 v) {
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] = Acc<T>::widen(e[i]);
  }
  template <RedOp kOp>
  __device__ __forceinline__ void combine(uint4 v) {
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] = apply<kOp>(x[i], Acc<T>::widen(e[i]));
  }
  __device__ __forceinline__ uint4 get() const {
    uint4 v;
    T* e = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int i = 0; i < kN; ++i) e[i] = Acc<T>::narrow(x[i]);
    return v;
  }
};

/// Vectors v0 + u * stride (u < kUnroll, those below hi) of src[0..world-1] (each nbytes long,
/// any alignment) reduced in rank order 0..p-1, so every rank that computes them gets the same
/// bits; a pair of ranks' loads are all issued before any is combined. Note [Paired loads]: two
/// ranks' loads fly together (2 x kUnroll vectors a thread), so a step waits on memory world / 2
/// times, not world times: at world 2 once. The two buffers take 32 registers more than one, so
/// the kernels that call this launch at most one block per SM of the budget (Note [Block budget])
/// and may take up to 128 registers a thread; under two blocks' 64 they spilled.
template <typename T, RedOp kOp>
__device__ __forceinline__ void reduceFrom(const char* const* src, int world, uint64_t nbytes, uint64_t v0,
                                           uint64_t stride, uint64_t hi, uint4 (&out)[kUnroll]) {
  Vec<T> acc[kUnroll];
  for (int q = 0; q < world; q += 2) {
    const char* const first = src[q];  // once per rank, in a register
    const char* const second = q + 1 < world ? src[q + 1] : nullptr;
    uint4 x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool in = v0 + u * stride < hi;
      x[u] = in ? loadFrom(first, v0 + u * stride, nbytes) : uint4{};
      y[u] = in && second ? loadFrom(second, v0 + u * stride, nbytes) : uint4{};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (q == 0) acc[u].set(x[u]);
      else acc[u].template combine<kOp>(x[u]);
      if (second) acc[u].template combine<kOp>(y[u]);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) out[u] = acc[u].get();
}

/// Note [One vector]: vectors v0 + u * stride (u < kVecs) reduced over src(0..world-1) in rank
/// order, with the loads of up to kWide ranks (kVecs x kWide vectors) in flight together.
/// reduceFrom loads a pair of ranks at a time to keep kUnroll vectors a thread in registers, and
/// the simple kernels reduced the staging buffers one rank at a time, so a thread waited on memory
/// world / 2 (or world) times in a row, even with a single vector to reduce, which is every thread
/// of a small call. The sources must be aligned and hold whole vectors (loadPeer): the staging
/// buffers always do (stageVectors zero-fills a partial last vector). The simple one_shot and
/// two_shot reduce every vector here (reduceWalk): two vectors of up to four ranks at once for 32-
/// and 64-bit types, one for 8- and 16-bit ones, whose widened pairs spilled under two blocks per
/// SM (at two ranks, two 16-bit vectors: as many loads in flight as four ranks' one). One rank at a
/// time, the one_shot's 8- and 16-bit instances spilled 48-266 bytes and the two_shot's 8-294 (8-,
/// 16-, 32- and 64-bit), and now none does. The NVSHMEM two-shot takes it for a thread's one
/// vector, where every source is aligned and the vector whole.
template <typename T, RedOp kOp, int kVecs, int kWide, typename Src>
__device__ __forceinline__ void reduceWide(Src src, int world, uint64_t v0, uint64_t stride, uint4 (&out)[kVecs]) {
  Vec<T> acc[kVecs];
  for (int q0 = 0; q0 < world; q0 += kWide) {
    uint4 x[kVecs][kWide];
#pragma unroll
    for (int u = 0; u < kVecs; ++u)
#pragma unroll
      for (int i = 0; i < kWide; ++i) x[u][i] = q0 + i < world ? loadPeer(src(q0 + i), v0 + u * stride) : uint4{};
#pragma unroll
    for (int u = 0; u < kVecs; ++u)
#pragma unroll
      for (int i = 0; i < kWide; ++i) {
        if (q0 + i == 0) acc[u].set(x[u][i]);
        else if (q0 + i < world) acc[u].template combine<kOp>(x[u][i]);
      }
  }
#pragma unroll
  for (int u = 0; u < kVecs; ++u) out[u] = acc[u].get();
}

template <typename T, RedOp kOp, int kWide, typename Src>
__device__ __forceinline__ uint4 reduceOne(Src src, int world, uint64_t v) {
  uint4 y[1];
  reduceWide<T, kOp, 1, kWide>(src, world, v, 0, y);
  return y[0];
}

/// Every vector of walk w reduced over src(0..world-1) as reduceWide does, each handed to
/// put(v, x), two vectors at a time where their loads fit in registers (Note [One vector]).
template <typename T, RedOp kOp, typename Src, typename Put>
__device__ __forceinline__ void reduceWalk(Src src, int world, const Walk& w, Put put) {
  constexpr int kWide = sizeof(T) >= 4 ? 4 : 2;  // ranks whose loads fly together
  uint64_t v = w.first;
  if (sizeof(T) >= 4 || (sizeof(T) == 2 && world <= 2))
    for (; v + w.step < w.end; v += 2 * w.step) {
      uint4 y[2];
      reduceWide<T, kOp, 2, kWide>(src, world, v, w.step, y);
      put(v, y[0]);
      put(v + w.step, y[1]);
    }
  for (; v < w.end; v += w.step) put(v, reduceOne<T, kOp, 4>(src, world, v));
}

}  // namespace tilecomm::cuda

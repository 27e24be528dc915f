// The NVSHMEM host library, loaded at run time (dlopen), never linked: a build
// or a process without it works as before, and the NVSHMEM algorithms are then
// simply not offered. Only host entry points are used (no device library, no
// relocatable device code): initialisation with a unique id, the symmetric
// heap (nvshmem_malloc, nvshmem_ptr), stream-ordered put-with-signal, and
// fcollect (for benchmarks). tilecomm's own kernels do the rest through the
// peer addresses nvshmem_ptr gives (peer_transport.h, PeerMemory::kNvshmem).
//
// Note [NVSHMEM lifetime]: NVSHMEM is initialised once per process, by the
// first group that needs it (its ranks become the PEs: group rank r is PE r),
// and never finalised before the process exits. Where the application
// initialised it already, through the same host library (nvshmem4py loads the
// one of the nvidia-nvshmem wheel, as tilecomm does), tilecomm takes that
// initialisation as it is (its PE r must be rank r), and the application's
// tensors on the heap are used in place. Another group may use it only
// if its rank r is PE r too (same size; agreed by every rank). Symmetric
// allocations are collective, so each is made inside a task of a group (issue
// order is the same on every rank) and none is ever freed: a free is
// collective as well, and ranks destroy groups and tensors at different times.
// Issue order holds within a group: where several groups use NVSHMEM, their
// first NVSHMEM call (the set-up) and their symmetric allocations must come in
// the same order on every rank (as with any collective over several groups;
// asynchronous operations of different groups are not ordered). The process
// makes one group's collective NVSHMEM calls at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace tilecomm::cuda::nvshmem {

/// Whether this build has the NVSHMEM parts (the headers were found at build time).
bool built();
/// Loads libnvshmem_host from `path` once per process. Returns "" or why it cannot (every later
/// call returns the same answer).
std::string load(const std::string& path);
/// The 128 bytes of a new unique id (the PE that creates it hands it to the others).
std::string uniqueId();
/// Initialises NVSHMEM with this process as PE `pe` of `npes` from a unique id, once per process
/// (Note [NVSHMEM lifetime]); the CUDA device must be current. Returns "" or why it failed.
std::string init(int pe, int npes, const std::string& unique_id);
/// PE and PE count, -1 before init (by a group, or by the application: Note [NVSHMEM lifetime]).
int myPe();
int nPes();
/// Collective: `bytes` of the symmetric heap (nullptr on failure).
void* malloc(uint64_t bytes);
/// The address through which this PE loads and stores `sym` on `pe`, or nullptr where it has none.
void* ptr(const void* sym, int pe);
/// Whether [p, p + bytes) lies in this PE's symmetric heap.
bool onHeap(const void* p, uint64_t bytes);
/// Host barrier of every PE (after the heap was set up, before the first put).
void barrierAll();
/// Stream-ordered: bytes from `src` (local) to `dest` (symmetric) on `pe`, then *sig = value there.
void putSignal(void* dest, const void* src, uint64_t bytes, uint64_t* sig, uint64_t value, int pe,
               cudaStream_t stream);
/// Stream-ordered: every earlier put of this PE delivered (so that the next call's puts, and their
/// signals, cannot overtake them on a transport that does not keep order).
void quiet(cudaStream_t stream);
/// What fcollect and sumReduce return where the library lacks the entry point.
constexpr int kMissing = -1000;
/// Stream-ordered NVSHMEM fcollect of `bytes` per PE over every PE (dest, src symmetric). Returns
/// NVSHMEM's status, or kMissing.
int fcollect(void* dest, const void* src, uint64_t bytes, cudaStream_t stream);
/// Stream-ordered NVSHMEM float sum reduction of `n` elements over every PE (dest, src symmetric).
/// Returns NVSHMEM's status, or kMissing.
int sumReduce(float* dest, const float* src, uint64_t n, cudaStream_t stream);

}  // namespace tilecomm::cuda::nvshmem

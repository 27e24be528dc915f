#include "cuda/nvshmem.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>

#ifdef TILECOMM_WITH_NVSHMEM
// NOTE: NVSHMEM's headers use cuda_fp16's operators, which torch's extension build turns off.
#undef __CUDA_NO_HALF_OPERATORS__
#undef __CUDA_NO_HALF_CONVERSIONS__
#undef __CUDA_NO_BFLOAT16_CONVERSIONS__
#undef __CUDA_NO_HALF2_OPERATORS__
#include <nvshmem.h>
#include <nvshmemx.h>
#endif

namespace tilecomm::cuda::nvshmem {

#ifdef TILECOMM_WITH_NVSHMEM

namespace {

// The entry points, with the headers' own signatures.
struct Api {
  decltype(&nvshmemx_get_uniqueid) get_uniqueid = nullptr;
  decltype(&nvshmemx_set_attr_uniqueid_args) set_attr_uniqueid_args = nullptr;
  decltype(&nvshmemx_hostlib_init_attr) init_attr = nullptr;
  decltype(&nvshmem_my_pe) my_pe = nullptr;
  decltype(&nvshmem_n_pes) n_pes = nullptr;
  decltype(&nvshmem_malloc) malloc = nullptr;
  void* (*ptr)(const void*, int) = nullptr;  // host and device in the header
  decltype(&nvshmem_barrier_all) barrier_all = nullptr;
  decltype(&nvshmemx_putmem_signal_on_stream) putmem_signal_on_stream = nullptr;
  decltype(&nvshmemx_fcollectmem_on_stream) fcollectmem_on_stream = nullptr;
  decltype(&nvshmemx_float_sum_reduce_on_stream) float_sum_reduce_on_stream = nullptr;
  decltype(&nvshmemx_quiet_on_stream) quiet_on_stream = nullptr;
  decltype(&nvshmemx_init_status) init_status = nullptr;
};

std::mutex g_mu;  // load and init
Api g_api;
void* g_lib = nullptr;
std::string g_load_why;  // "" once loaded
bool g_tried = false;
int g_pe = -1, g_npes = -1;
std::string g_init_why;  // set once an init failed: NVSHMEM cannot be initialised twice

template <typename F>
bool bind(F& f, const char* name, std::string& why) {
  f = reinterpret_cast<F>(dlsym(g_lib, name));
  if (!f && why.empty()) why = std::string("libnvshmem_host has no ") + name;
  return f != nullptr;
}

/// With g_mu held: where the application initialised NVSHMEM itself (nvshmem4py, or its own
/// nvshmemx_init_attr through the same library), takes this process's PE from it (Note [NVSHMEM
/// lifetime]).
void adoptLocked() {
  if (g_pe >= 0 || !g_lib || !g_load_why.empty() || !g_api.init_status) return;
  const int status = g_api.init_status();
  if (status < NVSHMEM_STATUS_IS_INITIALIZED || status == NVSHMEM_STATUS_INVALID) return;
  g_pe = g_api.my_pe();
  g_npes = g_api.n_pes();
}

}  // namespace

bool built() { return true; }

std::string load(const std::string& path) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_tried) return g_load_why;
  g_tried = true;
  if (path.empty()) return g_load_why = "the NVSHMEM host library was not found";
  // NOTE: RTLD_GLOBAL, so that NVSHMEM's own plugins (the unique-id bootstrap, transports),
  // which it opens next to itself, resolve against this copy.
  g_lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!g_lib) return g_load_why = std::string("dlopen(") + path + "): " + dlerror();
  std::string why;
  bind(g_api.get_uniqueid, "nvshmemx_get_uniqueid", why);
  bind(g_api.set_attr_uniqueid_args, "nvshmemx_set_attr_uniqueid_args", why);
  bind(g_api.init_attr, "nvshmemx_hostlib_init_attr", why);
  bind(g_api.my_pe, "nvshmem_my_pe", why);
  bind(g_api.n_pes, "nvshmem_n_pes", why);
  bind(g_api.malloc, "nvshmem_malloc", why);
  bind(g_api.ptr, "nvshmem_ptr", why);
  bind(g_api.barrier_all, "nvshmem_barrier_all", why);
  bind(g_api.putmem_signal_on_stream, "nvshmemx_putmem_signal_on_stream", why);
  bind(g_api.quiet_on_stream, "nvshmemx_quiet_on_stream", why);
  // NVSHMEM's own collectives, for the benchmarks only: a library without them still serves.
  std::string optional;
  bind(g_api.fcollectmem_on_stream, "nvshmemx_fcollectmem_on_stream", optional);
  bind(g_api.float_sum_reduce_on_stream, "nvshmemx_float_sum_reduce_on_stream", optional);
  bind(g_api.init_status, "nvshmemx_init_status", optional);
  g_load_why = why;
  adoptLocked();
  return g_load_why;
}

std::string uniqueId() {
  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  if (!g_load_why.empty() || g_api.get_uniqueid(&id) != 0) return "";
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

std::string init(int pe, int npes, const std::string& unique_id) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_tried || !g_load_why.empty()) return g_tried ? g_load_why : "the NVSHMEM host library is not loaded";
  adoptLocked();
  if (g_pe >= 0) {
    if (g_pe != pe || g_npes != npes)
      return "NVSHMEM was initialised (by another group, or by the application) as PE " + std::to_string(g_pe) +
             " of " + std::to_string(g_npes) + "; this group needs PE " + std::to_string(pe) + " of " +
             std::to_string(npes);
    return "";
  }
  if (!g_init_why.empty()) return g_init_why;
  if (unique_id.size() != sizeof(nvshmemx_uniqueid_t)) return g_init_why = "no NVSHMEM unique id from rank 0";
  nvshmemx_uniqueid_t id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  if (g_api.set_attr_uniqueid_args(pe, npes, &id, &attr) != 0)
    return g_init_why = "nvshmemx_set_attr_uniqueid_args failed";
  if (g_api.init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) != 0)
    return g_init_why = "nvshmemx_hostlib_init_attr failed (NVSHMEM_DEBUG=INFO says why)";
  g_pe = g_api.my_pe();
  g_npes = g_api.n_pes();
  if (g_pe != pe || g_npes != npes)
    return g_init_why = "NVSHMEM made this process PE " + std::to_string(g_pe) + " of " + std::to_string(g_npes);
  return "";
}

int myPe() {
  std::lock_guard<std::mutex> lk(g_mu);
  adoptLocked();
  return g_pe;
}
int nPes() { return g_npes; }

void* malloc(uint64_t bytes) { return g_pe >= 0 ? g_api.malloc(bytes) : nullptr; }

void* ptr(const void* sym, int pe) { return g_pe >= 0 ? g_api.ptr(sym, pe) : nullptr; }

bool onHeap(const void* p, uint64_t bytes) {
  // NVSHMEM answers a local PE's address inside the heap with the address itself, else nullptr.
  if (g_pe < 0 || bytes == 0) return false;
  const char* c = static_cast<const char*>(p);
  return g_api.ptr(c, g_pe) == c && g_api.ptr(c + bytes - 1, g_pe) == c + bytes - 1;
}

void barrierAll() {
  if (g_pe >= 0) g_api.barrier_all();
}

void putSignal(void* dest, const void* src, uint64_t bytes, uint64_t* sig, uint64_t value, int pe,
               cudaStream_t stream) {
  g_api.putmem_signal_on_stream(dest, src, bytes, sig, value, NVSHMEM_SIGNAL_SET, pe, stream);
}

void quiet(cudaStream_t stream) { g_api.quiet_on_stream(stream); }

int fcollect(void* dest, const void* src, uint64_t bytes, cudaStream_t stream) {
  if (!g_api.fcollectmem_on_stream) return kMissing;
  return g_api.fcollectmem_on_stream(NVSHMEM_TEAM_WORLD, dest, src, bytes, stream);
}

int sumReduce(float* dest, const float* src, uint64_t n, cudaStream_t stream) {
  if (!g_api.float_sum_reduce_on_stream) return kMissing;
  return g_api.float_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, dest, src, n, stream);
}

#else  // built without the NVSHMEM headers: nothing is offered, and load() says why

bool built() { return false; }
std::string load(const std::string&) {
  return "tilecomm was built without the NVSHMEM headers (install nvidia-nvshmem-cu13 and rebuild)";
}
std::string uniqueId() { return ""; }
std::string init(int, int, const std::string&) { return load(""); }
int myPe() { return -1; }
int nPes() { return -1; }
void* malloc(uint64_t) { return nullptr; }
void* ptr(const void*, int) { return nullptr; }
bool onHeap(const void*, uint64_t) { return false; }
void barrierAll() {}
void putSignal(void*, const void*, uint64_t, uint64_t*, uint64_t, int, cudaStream_t) {}
void quiet(cudaStream_t) {}
int fcollect(void*, const void*, uint64_t, cudaStream_t) { return kMissing; }
int sumReduce(float*, const float*, uint64_t, cudaStream_t) { return kMissing; }

#endif

}  // namespace tilecomm::cuda::nvshmem

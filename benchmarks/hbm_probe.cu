// What the one-GPU all_reduce and all_gather kernels could reach, with no flags, no processes
// and no skew: W "ranks" are W kernels on W streams of one process, each doing its share of the
// collective over W buffers (all_reduce: part q of every buffer reduced in rank order and stored
// into all W, 2 x W x n bytes; all_gather: its n-byte block read once and stored into block q of
// all W outputs, (1 + W) x W x n bytes). The variants differ in how a grid walks its vectors:
// "blocked" gives each thread block one contiguous range (as the kernels do), "strided" lets
// the whole grid sweep the range together (as a memcpy kernel does), at 1, 2 or 4 blocks per SM
// of the rank's share. References, timed the same way: cudaMemcpyAsync and a copy kernel over
// W x n bytes on one stream, and a write-only kernel. Prints the best of 5 per variant and its
// rate in TB/s of the variant's own traffic.
//
// `probe procs` runs the strided kernels as tilecomm runs them instead: W processes (start the MPS
// daemon first, as scripts/gpu-test does), each with its own allocations, peers' opened with
// cudaIpcOpenMemHandle ("ipc"), against the same kernels on W allocations of the process's own
// ("local", the same traffic), 10 back-to-back launches per process after a host barrier, the
// slowest process's time per launch; and the ipc variants "+ flags", with the kernels' own
// synchronization (every block meets its peers' same block before and after the loop).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a benchmarks/hbm_probe.cu -o probe && ./probe
//   ./probe procs          (worlds 2 and 4; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is passed on)
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t err_ = (x);                                            \
    if (err_ != cudaSuccess) {                                         \
      printf("%s: %s\n", #x, cudaGetErrorString(err_));                \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

constexpr int kThreads = 512;
constexpr int kU = 4;

struct Args {
  float4* buf[8];  // all_reduce: the W tensors; all_gather: the W outputs
  const float4* in;  // all_gather: this rank's block
  uint64_t lo, hi;   // all_reduce: this rank's part [lo, hi) of every tensor; all_gather: block at lo
  uint64_t n;        // all_gather: vectors per block
  int world, rank;
  uint64_t* flags[8];  // "+ flags": every rank's flags, [phase][block]
  uint64_t seq;        // this launch's flag value (0: no flags)
};

// "+ flags" (several processes only): the kernels' own synchronization around the loop: before it,
// every block announces seq and waits until every peer's same block has; after it, the same again
// (all_gather: the data is in every output; all_reduce: every part is stored).
__device__ __forceinline__ void meet(const Args& a, int phase) {
  if (a.seq == 0) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(a.flags[a.rank] + phase * 256 + blockIdx.x), "l"(a.seq)
                 : "memory");
  }
  if (threadIdx.x < a.world && threadIdx.x != a.rank) {
    const uint64_t* f = a.flags[threadIdx.x] + phase * 256 + blockIdx.x;
    uint64_t v;
    do {
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(f) : "memory");
    } while (v < a.seq);
  }
  __syncthreads();
}

__device__ __forceinline__ void add(float4& a, const float4& b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}

// The range walk: blocked (one contiguous range per block, stepping kU x blockDim) or strided
// (the grid steps kU x gridDim x blockDim together). f(v, step) handles vectors v + u * step.
template <bool kStrided, typename F>
__device__ __forceinline__ void walk(uint64_t lo, uint64_t hi, F f) {
  if (kStrided) {
    const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
    for (uint64_t v = lo + blockIdx.x * blockDim.x + threadIdx.x; v < hi; v += kU * step) f(v, step, hi);
  } else {
    const uint64_t n = hi - lo;
    const uint64_t b0 = lo + n * blockIdx.x / gridDim.x, b1 = lo + n * (blockIdx.x + 1) / gridDim.x;
    for (uint64_t v = b0 + threadIdx.x; v < b1; v += kU * blockDim.x) f(v, static_cast<uint64_t>(blockDim.x), b1);
  }
}

// all_reduce: rank order 0..W-1, kU loads per rank in flight (the kernels' reduceFrom).
template <bool kStrided>
__global__ void __launch_bounds__(kThreads, 2) reduceKernel(Args a) {
  meet(a, 0);
  walk<kStrided>(a.lo, a.hi, [&](uint64_t v, uint64_t step, uint64_t end) {
    float4 acc[kU];
    for (int q = 0; q < a.world; ++q) {
      float4 x[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) x[u] = v + u * step < end ? __ldcg(a.buf[q] + v + u * step) : float4{};
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (q == 0) acc[u] = x[u];
        else add(acc[u], x[u]);
      }
    }
    for (int i = 0; i < a.world; ++i) {
      const int q = (a.rank + i) % a.world;
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (v + u * step < end) a.buf[q][v + u * step] = acc[u];
    }
  });
  meet(a, 1);
}

// all_gather push: my block read once, stored into block `rank` of every output.
template <bool kStrided>
__global__ void __launch_bounds__(kThreads, 2) gatherKernel(Args a) {
  meet(a, 0);
  walk<kStrided>(0, a.n, [&](uint64_t v, uint64_t step, uint64_t end) {
    float4 x[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) x[u] = v + u * step < end ? __ldcg(a.in + v + u * step) : float4{};
    for (int i = 0; i < a.world; ++i) {
      float4* dst = a.buf[(a.rank + i) % a.world] + a.lo;
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (v + u * step < end) dst[v + u * step] = x[u];
    }
  });
  meet(a, 1);
}

template <bool kStrided>
__global__ void __launch_bounds__(kThreads, 2) copyKernel(const float4* src, float4* dst, uint64_t n) {
  walk<kStrided>(0, n, [&](uint64_t v, uint64_t step, uint64_t end) {
    float4 x[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) x[u] = v + u * step < end ? __ldcg(src + v + u * step) : float4{};
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (v + u * step < end) dst[v + u * step] = x[u];
  });
}

template <bool kStrided>
__global__ void __launch_bounds__(kThreads, 2) fillKernel(float4* dst, uint64_t n) {
  walk<kStrided>(0, n, [&](uint64_t v, uint64_t step, uint64_t end) {
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (v + u * step < end) dst[v + u * step] = make_float4(1.f, 2.f, 3.f, 4.f);
  });
}

// ---- several processes ----

struct Shared {
  std::atomic<uint64_t> arrived;
  cudaIpcMemHandle_t tensor[8], output[8], flags[8];
  float us[8];
};

void barrier(Shared* sh, int world, uint64_t& k) {
  ++k;
  sh->arrived.fetch_add(1);
  while (sh->arrived.load() < k * world) {
  }
}

void rankMain(int rank, int world, Shared* sh) {
  CK(cudaSetDevice(0));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const char* pct_env = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
  const double pct = pct_env ? atof(pct_env) : 100.0;
  const int share = static_cast<int>(std::min<double>(sms, sms * 100.0 / pct / world));  // Note [Block budget]
  const uint64_t maxn = 256ull << 20;
  float4 *tensor, *in, *output;
  CK(cudaMalloc(&tensor, maxn));
  CK(cudaMalloc(&in, maxn));
  CK(cudaMalloc(&output, maxn * world));
  std::vector<float4*> local(world), local_out(world), peer(world), peer_out(world);
  for (int q = 0; q < world; ++q) {
    CK(cudaMalloc(&local[q], maxn));
    CK(cudaMalloc(&local_out[q], maxn * world));
  }
  uint64_t* flags;
  CK(cudaMalloc(&flags, 2 * 256 * sizeof(uint64_t)));
  CK(cudaMemset(flags, 0, 2 * 256 * sizeof(uint64_t)));
  std::vector<uint64_t*> peer_flags(world);
  CK(cudaIpcGetMemHandle(&sh->flags[rank], flags));
  CK(cudaIpcGetMemHandle(&sh->tensor[rank], tensor));
  CK(cudaIpcGetMemHandle(&sh->output[rank], output));
  uint64_t k = 0;
  barrier(sh, world, k);
  for (int q = 0; q < world; ++q) {
    if (q == rank) {
      peer[q] = tensor;
      peer_out[q] = output;
      peer_flags[q] = flags;
      continue;
    }
    void* p;
    CK(cudaIpcOpenMemHandle(&p, sh->flags[q], cudaIpcMemLazyEnablePeerAccess));
    peer_flags[q] = static_cast<uint64_t*>(p);
    CK(cudaIpcOpenMemHandle(&p, sh->tensor[q], cudaIpcMemLazyEnablePeerAccess));
    peer[q] = static_cast<float4*>(p);
    CK(cudaIpcOpenMemHandle(&p, sh->output[q], cudaIpcMemLazyEnablePeerAccess));
    peer_out[q] = static_cast<float4*>(p);
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (uint64_t n : {16ull << 20, 64ull << 20, 256ull << 20}) {
    const uint64_t nvec = n / 16;
    for (int per_sm : {1, 2}) {
      for (int variant = 0; variant < 7; ++variant) {
        const int iters = 10;
        auto launch = [&] {
          Args a{};
          a.world = world;
          a.rank = rank;
          const int blocks = per_sm * share;
          static uint64_t seq = 0;
          if (variant >= 5) {  // the ipc variants with the kernels' flags
            a.seq = ++seq;
            for (int i = 0; i < world; ++i) a.flags[i] = peer_flags[i];
          }
          if (variant == 4) {
            copyKernel<true><<<blocks, kThreads, 0, st>>>(in, local[0], nvec);
          } else if (variant < 2 || variant == 5) {  // all_reduce over the peers' tensors, or over local ones
            for (int i = 0; i < world; ++i) a.buf[i] = variant != 1 ? peer[i] : local[i];
            a.lo = nvec * rank / world;
            a.hi = nvec * (rank + 1) / world;
            reduceKernel<true><<<blocks, kThreads, 0, st>>>(a);
          } else {  // all_gather into the peers' outputs, or into local ones
            for (int i = 0; i < world; ++i) a.buf[i] = variant != 3 ? peer_out[i] : local_out[i];
            a.in = in;
            a.n = nvec;
            a.lo = nvec * rank;
            gatherKernel<true><<<blocks, kThreads, 0, st>>>(a);
          }
        };
        launch();  // warm-up
        CK(cudaStreamSynchronize(st));
        barrier(sh, world, k);
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < iters; ++i) launch();
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        sh->us[rank] = ms * 1000.0f / iters;
        barrier(sh, world, k);
        if (rank == 0) {
          float us = 0;
          for (int q = 0; q < world; ++q) us = std::max(us, sh->us[q]);
          static const char* names[] = {"all_reduce ipc", "all_reduce local", "all_gather ipc", "all_gather local",
                                        "copy n per process", "all_reduce ipc + flags", "all_gather ipc + flags"};
          const double whole = static_cast<double>(n) * world;
          const bool gather = variant == 2 || variant == 3 || variant == 6;
          const double traffic = gather ? (1.0 + world) * whole : 2 * whole;
          printf("procs %d %4llu MiB  %-20s %d/SM  %9.1f us  %5.2f TB/s\n", world, (unsigned long long)(n >> 20),
                 names[variant], per_sm, us, traffic / us / 1e6);
          fflush(stdout);
        }
        barrier(sh, world, k);
      }
    }
  }
  barrier(sh, world, k);  // nobody frees what a peer still has open
}

int procsMain() {
  for (int world : {2, 4}) {
    Shared* sh = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    new (sh) Shared{};
    std::vector<pid_t> kids;
    for (int r = 0; r < world; ++r) {
      const pid_t pid = fork();
      if (pid == 0) {
        rankMain(r, world, sh);
        _exit(0);
      }
      kids.push_back(pid);
    }
    int bad = 0;
    for (pid_t pid : kids) {
      int status = 0;
      waitpid(pid, &status, 0);
      bad += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    munmap(sh, sizeof(Shared));
    if (bad) return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "procs") return procsMain();
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<uint64_t> sizes = {16ull << 20, 64ull << 20, 256ull << 20};
  const int worlds[] = {2, 4};
  const uint64_t maxn = 256ull << 20;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int world : worlds) {
    std::vector<float4*> bufs(world), ins(world);
    for (int q = 0; q < world; ++q) {
      CK(cudaMalloc(&bufs[q], maxn * world));  // all_gather outputs hold world blocks
      CK(cudaMalloc(&ins[q], maxn));
      CK(cudaMemset(bufs[q], 0, maxn * world));
      CK(cudaMemset(ins[q], 0, maxn));
    }
    float4 *big_src, *big_dst;
    CK(cudaMalloc(&big_src, maxn * world));
    CK(cudaMalloc(&big_dst, maxn * world));
    std::vector<cudaStream_t> st(world);
    for (auto& s : st) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<cudaEvent_t> done(world);
    for (auto& e : done) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const int share = sms / world;  // the rank's SMs (Note [Block budget])
    for (uint64_t n : sizes) {
      const uint64_t nvec = n / 16;
      // Times `launch(q)` on every rank's stream at once (one rank: launch(0) only), best of 5.
      auto timeit = [&](int ranks, auto launch) {
        float best = 1e30f;
        for (int it = 0; it < 6; ++it) {
          CK(cudaDeviceSynchronize());
          CK(cudaEventRecord(e0, st[0]));
          for (int q = 1; q < ranks; ++q) CK(cudaStreamWaitEvent(st[q], e0));
          for (int q = 0; q < ranks; ++q) launch(q);
          for (int q = 1; q < ranks; ++q) {
            CK(cudaEventRecord(done[q], st[q]));
            CK(cudaStreamWaitEvent(st[0], done[q]));
          }
          CK(cudaEventRecord(e1, st[0]));
          CK(cudaEventSynchronize(e1));
          CK(cudaGetLastError());
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          if (it > 0 && ms < best) best = ms;
        }
        return best * 1000.0f;
      };
      auto report = [&](const char* what, double traffic, float us) {
        printf("world %d %4llu MiB  %-34s %9.1f us  %5.2f TB/s\n", world, (unsigned long long)(n >> 20), what, us,
               traffic / us / 1e6);
      };
      const double whole = static_cast<double>(n) * world;
      report("ref memcpy W x n", 2 * whole,
             timeit(1, [&](int) { CK(cudaMemcpyAsync(big_dst, big_src, n * world, cudaMemcpyDeviceToDevice, st[0])); }));
      for (int per_sm : {1, 2}) {
        char name[64];
        snprintf(name, sizeof name, "ref copy kernel blocked %d/SM", per_sm);
        report(name, 2 * whole, timeit(1, [&](int) { copyKernel<false><<<per_sm * sms, kThreads, 0, st[0]>>>(big_src, big_dst, nvec * world); }));
        snprintf(name, sizeof name, "ref copy kernel strided %d/SM", per_sm);
        report(name, 2 * whole, timeit(1, [&](int) { copyKernel<true><<<per_sm * sms, kThreads, 0, st[0]>>>(big_src, big_dst, nvec * world); }));
        snprintf(name, sizeof name, "ref fill kernel strided %d/SM", per_sm);
        report(name, whole, timeit(1, [&](int) { fillKernel<true><<<per_sm * sms, kThreads, 0, st[0]>>>(big_dst, nvec * world); }));
      }
      for (int per_sm : {1, 2, 4}) {
        for (bool strided : {false, true}) {
          const int blocks = per_sm * share;
          char name[64];
          snprintf(name, sizeof name, "all_reduce %s %d/SM", strided ? "strided" : "blocked", per_sm);
          report(name, 2 * whole, timeit(world, [&](int q) {
                   Args a{};
                   for (int i = 0; i < world; ++i) a.buf[i] = bufs[i];
                   a.world = world;
                   a.rank = q;
                   a.lo = nvec * q / world;
                   a.hi = nvec * (q + 1) / world;
                   if (strided) reduceKernel<true><<<blocks, kThreads, 0, st[q]>>>(a);
                   else reduceKernel<false><<<blocks, kThreads, 0, st[q]>>>(a);
                 }));
          snprintf(name, sizeof name, "all_gather %s %d/SM", strided ? "strided" : "blocked", per_sm);
          report(name, (1.0 + world) * whole, timeit(world, [&](int q) {
                   Args a{};
                   for (int i = 0; i < world; ++i) a.buf[i] = bufs[i];
                   a.in = ins[q];
                   a.world = world;
                   a.rank = q;
                   a.n = nvec;
                   a.lo = nvec * q;
                   if (strided) gatherKernel<true><<<blocks, kThreads, 0, st[q]>>>(a);
                   else gatherKernel<false><<<blocks, kThreads, 0, st[q]>>>(a);
                 }));
        }
      }
      report("all_gather W memcpys per rank", 2.0 * world * whole, timeit(world, [&](int q) {
               for (int i = 0; i < world; ++i)
                 CK(cudaMemcpyAsync(bufs[(q + i) % world] + nvec * q, ins[q], n, cudaMemcpyDeviceToDevice, st[q]));
             }));
    }
    for (int q = 0; q < world; ++q) {
      cudaFree(bufs[q]);
      cudaFree(ins[q]);
    }
    cudaFree(big_src);
    cudaFree(big_dst);
  }
  return 0;
}

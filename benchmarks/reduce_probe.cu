// How fast can the registered two-shot's inner loop go on this GPU, with no flags, no
// processes and no skew? W "ranks" are W kernels on W streams of one process, each reducing its
// part of W float32 buffers in rank order and storing the sum into all W (the traffic of the
// registered and NVSHMEM in-place two-shot: 2 x W x bytes), in variants of loads in flight per
// thread (ranks loaded one or G at a time, U vectors each, the world as a template), blocks per
// SM and cache hints; plus copy kernels and cudaMemcpyAsync for the reference. Prints each
// variant's best of 5 and its share of the HBM bound (2 x W x bytes at 4.48 TB/s).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a benchmarks/reduce_probe.cu -o probe && ./probe
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cstring>

#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(err_)); exit(1);} } while (0)

struct Args { float4* buf[8]; uint64_t lo, hi; int world; };

__device__ __forceinline__ float4 ld(const float4* p) { return __ldcg(p); }
__device__ __forceinline__ float4 ldh(const float4* p) {
  float4 v;
  asm volatile("ld.global.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void stcs(float4* p, float4 v) { __stcs(p, v); }
template <int L> __device__ __forceinline__ float4 LD(const float4* p) { if constexpr (L == 0) return ld(p); else return ldh(p); }
template <int S> __device__ __forceinline__ void ST(float4* p, float4 v) { if constexpr (S == 0) *p = v; else if constexpr (S == 1) __stcs(p, v); else __stcg(p, v); }
__device__ __forceinline__ void add(float4& a, const float4& b) { a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w; }

// A: the loop of the kernels (reduceFrom in cuda/primitives.cuh): per rank, U loads then combine; runtime world.
template <int U, int MINB>
__global__ void __launch_bounds__(512, MINB) kA(Args a) {
  const uint64_t n = a.hi - a.lo;
  const uint64_t lo = a.lo + n * blockIdx.x / gridDim.x, hi = a.lo + n * (blockIdx.x + 1) / gridDim.x;
  for (uint64_t v = lo + threadIdx.x; v < hi; v += U * blockDim.x) {
    float4 acc[U];
    for (int q = 0; q < a.world; ++q) {
      float4 x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) x[u] = v + u * blockDim.x < hi ? ld(a.buf[q] + v + u * blockDim.x) : float4{};
#pragma unroll
      for (int u = 0; u < U; ++u) { if (q == 0) acc[u] = x[u]; else add(acc[u], x[u]); }
    }
    for (int q = 0; q < a.world; ++q)
#pragma unroll
      for (int u = 0; u < U; ++u) if (v + u * blockDim.x < hi) a.buf[q][v + u * blockDim.x] = acc[u];
  }
}

// B: world as a template: all W x U loads issued first.
template <int W, int U, int MINB>
__global__ void __launch_bounds__(512, MINB) kB(Args a) {
  const uint64_t n = a.hi - a.lo;
  const uint64_t lo = a.lo + n * blockIdx.x / gridDim.x, hi = a.lo + n * (blockIdx.x + 1) / gridDim.x;
  for (uint64_t v = lo + threadIdx.x; v < hi; v += U * blockDim.x) {
    float4 x[W][U];
#pragma unroll
    for (int q = 0; q < W; ++q)
#pragma unroll
      for (int u = 0; u < U; ++u) x[q][u] = v + u * blockDim.x < hi ? ld(a.buf[q] + v + u * blockDim.x) : float4{};
#pragma unroll
    for (int q = 1; q < W; ++q)
#pragma unroll
      for (int u = 0; u < U; ++u) add(x[0][u], x[q][u]);
#pragma unroll
    for (int q = 0; q < W; ++q)
#pragma unroll
      for (int u = 0; u < U; ++u) if (v + u * blockDim.x < hi) a.buf[q][v + u * blockDim.x] = x[0][u];
  }
}

// Copy reference: each "rank" copies its N bytes src -> dst. H: the reduction with ranks loaded G at a
// time (runtime world), load hint L (0 plain, 1 L2::256B) and store kind S (0 plain, 1 .cs, 2 .cg).
template <int U, int MINB, int L, int S>
__global__ void __launch_bounds__(512, MINB) kCopyH(const float4* src, float4* dst, uint64_t n) {
  const uint64_t lo = n * blockIdx.x / gridDim.x, hi = n * (blockIdx.x + 1) / gridDim.x;
  for (uint64_t v = lo + threadIdx.x; v < hi; v += U * blockDim.x) {
    float4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = v + u * blockDim.x < hi ? LD<L>(src + v + u * blockDim.x) : float4{};
#pragma unroll
    for (int u = 0; u < U; ++u) if (v + u * blockDim.x < hi) ST<S>(dst + v + u * blockDim.x, x[u]);
  }
}
template <int G, int U, int MINB, int L, int S>
__global__ void __launch_bounds__(512, MINB) kH(Args a) {
  const uint64_t n = a.hi - a.lo;
  const uint64_t lo = a.lo + n * blockIdx.x / gridDim.x, hi = a.lo + n * (blockIdx.x + 1) / gridDim.x;
  for (uint64_t v = lo + threadIdx.x; v < hi; v += U * blockDim.x) {
    float4 acc[U];
    for (int q0 = 0; q0 < a.world; q0 += G) {
      float4 x[G][U];
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int u = 0; u < U; ++u)
          x[g][u] = q0 + g < a.world && v + u * blockDim.x < hi ? LD<L>(a.buf[q0 + g] + v + u * blockDim.x) : float4{};
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (q0 + g >= a.world) continue;
          if (q0 + g == 0) acc[u] = x[g][u]; else add(acc[u], x[g][u]);
        }
    }
    for (int q = 0; q < a.world; ++q)
#pragma unroll
      for (int u = 0; u < U; ++u) if (v + u * blockDim.x < hi) ST<S>(a.buf[q] + v + u * blockDim.x, acc[u]);
  }
}

typedef void (*Kern)(Args);
typedef void (*CKern)(const float4*, float4*, uint64_t);

int main(int argc, char** argv) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const uint64_t sizes[] = {16ull << 20, 64ull << 20, 256ull << 20};
  for (int world : {2, 4, 8}) {
    std::vector<float4*> bufs(world), copies(world);
    const uint64_t maxn = 256ull << 20;
    for (int q = 0; q < world; ++q) { CK(cudaMalloc(&bufs[q], maxn)); CK(cudaMalloc(&copies[q], maxn)); CK(cudaMemset(bufs[q], 0, maxn)); }
    std::vector<cudaStream_t> st(world);
    for (auto& s : st) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<cudaEvent_t> done(world);
    for (auto& e : done) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const int budget = sms / world;
    struct V { const char* name; Kern k; int blocks; };
    std::vector<V> vs;
    vs.push_back({"A u4 2/SM (kernels)", kA<4, 2>, 2 * budget});
    vs.push_back({"H g1 u4 2/SM L2hint", kH<1, 4, 2, 1, 0>, 2 * budget});
    vs.push_back({"H g1 u4 2/SM L2hint cs", kH<1, 4, 2, 1, 1>, 2 * budget});
    vs.push_back({"H g1 u4 2/SM L2hint cg", kH<1, 4, 2, 1, 2>, 2 * budget});
    vs.push_back({"H g2 u4 2/SM L2hint", kH<2, 4, 2, 1, 0>, 2 * budget});
    vs.push_back({"H g2 u4 4/SM L2hint", kH<2, 4, 2, 1, 0>, 4 * budget});
    vs.push_back({"H g1 u8 1/SM L2hint", kH<1, 8, 1, 1, 0>, budget});
    vs.push_back({"H g1 u4 2/SM x8blk", kH<1, 4, 2, 1, 0>, 8 * budget});
    vs.push_back({"C g2 u4 2/SM", kH<2, 4, 2, 0, 0>, 2 * budget});
    vs.push_back({"C g2 u4 4blk/SM", kH<2, 4, 2, 0, 0>, 4 * budget});
    if (world == 2) { vs.push_back({"B w2 u4 2/SM", kB<2, 4, 2>, 2 * budget}); vs.push_back({"B w2 u2 2/SM", kB<2, 2, 2>, 2 * budget}); }
    if (world == 4) { vs.push_back({"B w4 u2 2/SM", kB<4, 2, 2>, 2 * budget}); vs.push_back({"B w4 u1 2/SM", kB<4, 1, 2>, 2 * budget}); vs.push_back({"B w4 u4 1/SM", kB<4, 4, 1>, budget}); }
    if (world == 8) { vs.push_back({"B w8 u1 2/SM", kB<8, 1, 2>, 2 * budget}); vs.push_back({"B w8 u2 1/SM", kB<8, 2, 1>, budget}); }
    for (uint64_t n : sizes) {
      const uint64_t nvec = n / 16;
      const double bound_us = 2.0 * world * n / 4.48e12 * 1e6;
      auto timeit = [&](auto launch) {
        float best = 1e30f;
        for (int it = 0; it < 6; ++it) {
          CK(cudaDeviceSynchronize());
          CK(cudaEventRecord(e0, st[0]));
          for (int q = 1; q < world; ++q) CK(cudaStreamWaitEvent(st[q], e0));
          for (int q = 0; q < world; ++q) launch(q);
          for (int q = 1; q < world; ++q) { CK(cudaEventRecord(done[q], st[q])); CK(cudaStreamWaitEvent(st[0], done[q])); }
          CK(cudaEventRecord(e1, st[0]));
          CK(cudaEventSynchronize(e1));
          float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
          if (it > 0 && ms < best) best = ms;
        }
        return best * 1000.0f;
      };
      float cp = timeit([&](int q) { kCopyH<4, 2, 0, 0><<<2 * budget, 512, 0, st[q]>>>(bufs[q], copies[q], nvec); });
      float cpm = timeit([&](int q) { CK(cudaMemcpyAsync(copies[q], bufs[q], n, cudaMemcpyDeviceToDevice, st[q])); });
      struct CV { const char* name; CKern k; int blocks; };
      for (CV c : {CV{"copy u4 2/SM L2hint", kCopyH<4, 2, 1, 0>, 2 * budget}, CV{"copy u8 2/SM L2hint", kCopyH<8, 2, 1, 0>, 2 * budget},
                   CV{"copy u4 2/SM cs", kCopyH<4, 2, 0, 1>, 2 * budget}, CV{"copy u4 4/SM", kCopyH<4, 2, 0, 0>, 4 * budget},
                   CV{"copy u4 8x", kCopyH<4, 2, 1, 0>, 8 * budget}, CV{"copy u4 32x", kCopyH<4, 2, 1, 0>, 32 * budget}}) {
        float t = timeit([&](int q) { c.k<<<c.blocks, 512, 0, st[q]>>>(bufs[q], copies[q], nvec); });
        printf("  %-22s %8.0f us  %.2f TB/s\n", c.name, t, 2.0 * world * n / t / 1e6);
      }
      printf("world %d size %llu MiB: bound %.0f us (copy kernel %.0f us = %.2f TB/s, memcpy %.0f us = %.2f TB/s)\n", world,
             (unsigned long long)(n >> 20), bound_us, cp, 2.0 * world * n / cp / 1e6, cpm, 2.0 * world * n / cpm / 1e6);
      for (auto& v : vs) {
        float t = timeit([&](int q) {
          Args a{};
          for (int i = 0; i < world; ++i) a.buf[i] = bufs[i];
          a.world = world; a.lo = nvec * q / world; a.hi = nvec * (q + 1) / world;
          v.k<<<v.blocks, 512, 0, st[q]>>>(a);
        });
        CK(cudaGetLastError());
        printf("  %-22s %8.0f us  %5.1f%% of bound\n", v.name, t, 100.0 * bound_us / t);
      }
    }
    for (int q = 0; q < world; ++q) { cudaFree(bufs[q]); cudaFree(copies[q]); }
  }
  return 0;
}

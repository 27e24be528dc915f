// Device primitives of the direct kernels: 16-byte staging loads and stores,
// flag signal/wait with a timeout measured on the GPU, and reduce<Op, T> over
// one 16-byte vector. No collective logic lives here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/types.h"
#include "cuda/cuda_ipc.h"

namespace tilecomm::cuda {

constexpr int kThreads = 512;

/// What every direct kernel gets (by value).
struct DirectArgs {
  PeerTable peers;
  char* data;          // the user's tensor, reduced in place
  uint64_t nbytes;
  uint64_t capacity;   // bytes per staging buffer
  uint64_t seq;        // this call's sequence number (Note [Flags])
  uint64_t timeout_ns;
  KernelError* err;
  int rank;
  int world;
};

// ---- time and flags ----

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

/// Block-wide: once every thread's earlier stores are done, announces `seq` on this block's flag.
__device__ __forceinline__ void signal(const DirectArgs& a, int phase) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    storeRelease(flagOf(a.peers.base[a.rank], phase, blockIdx.x), a.seq);
  }
}

/// Block-wide: waits until every peer announced `a.seq` for this block and phase. Thread q
/// polls rank q. Returns false (the same in every thread) if a wait outlasted the timeout;
/// the first failing block records which rank it waited for.
__device__ __forceinline__ bool waitPeers(const DirectArgs& a, int phase) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const int q = threadIdx.x;
  if (q < a.world && q != a.rank) {
    const uint64_t* f = flagOf(a.peers.base[q], phase, blockIdx.x);
    const uint64_t start = globalTimer();
    uint32_t polls = 0;
    while (loadAcquire(f) < a.seq) {
      if (++polls > 256) {
        __nanosleep(100);
        uint64_t waited = globalTimer() - start;
        if (waited > a.timeout_ns) {
          failed = 1;
          if (atomicCAS_system(&a.err->claimed, 0u, 1u) == 0u) {
            a.err->peer = q;
            a.err->block = blockIdx.x;
            a.err->seq = a.seq;
            a.err->waited_ns = waited;
            __threadfence_system();
            atomicExch_system(&a.err->ready, 1u);
          }
          break;
        }
      }
    }
  }
  __syncthreads();
  return failed == 0;
}

// ---- 16-byte vectors ----

/// Vector v of the user's buffer; bytes past nbytes read as zero.
__device__ __forceinline__ uint4 loadUser(const char* p, uint64_t v, uint64_t nbytes, bool aligned) {
  const uint64_t off = v * 16;
  if (aligned && off + 16 <= nbytes) return *reinterpret_cast<const uint4*>(p + off);
  uint4 r = make_uint4(0, 0, 0, 0);
  char* b = reinterpret_cast<char*>(&r);
  for (int i = 0; i < 16 && off + i < nbytes; ++i) b[i] = p[off + i];
  return r;
}

/// Writes vector v into the user's buffer, never past nbytes.
__device__ __forceinline__ void storeUser(char* p, uint64_t v, uint64_t nbytes, bool aligned, uint4 x) {
  const uint64_t off = v * 16;
  if (aligned && off + 16 <= nbytes) {
    *reinterpret_cast<uint4*>(p + off) = x;
    return;
  }
  const char* b = reinterpret_cast<const char*>(&x);
  for (int i = 0; i < 16 && off + i < nbytes; ++i) p[off + i] = b[i];
}

/// A peer's staging vector: 16-byte load cached in L2 only (peers write it between calls).
__device__ __forceinline__ uint4 loadPeer(const char* staging, uint64_t v) {
  return __ldcg(reinterpret_cast<const uint4*>(staging) + v);
}

__device__ __forceinline__ void storeStaging(char* staging, uint64_t v, uint4 x) {
  __stcg(reinterpret_cast<uint4*>(staging) + v, x);
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

/// Vector v reduced over every rank's staging buffer, in rank order 0..p-1, so every rank
/// that computes it gets the same bits.
template <typename T, RedOp kOp>
__device__ __forceinline__ uint4 reduceRanks(const DirectArgs& a, uint64_t v) {
  Vec<T> acc;
  acc.set(loadPeer(stagingOf(a.peers.base[0], a.capacity, a.seq), v));
  for (int q = 1; q < a.world; ++q)
    acc.template combine<kOp>(loadPeer(stagingOf(a.peers.base[q], a.capacity, a.seq), v));
  return acc.get();
}

/// This block's share [lo, hi) of `n` vectors.
__device__ __forceinline__ void blockRange(uint64_t n, uint64_t& lo, uint64_t& hi) {
  lo = n * blockIdx.x / gridDim.x;
  hi = n * (blockIdx.x + 1) / gridDim.x;
}

}  // namespace tilecomm::cuda

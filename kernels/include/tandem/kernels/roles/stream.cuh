// tandem kernels — the data movement of the communication roles: block-wide streaming copy and reduction of
// 16-byte vectors with many bytes in flight per thread.
//
// Why these exist: a comm role runs on few SMs beside a GEMM, so each SM must move bytes at the rate the memory
// system allows it, and that rate is set by the bytes a thread has in flight (Little's law: an SM at ~40 GB/s
// against ~1.5 us of loaded latency needs ~60 KB outstanding). The first TP roles issued 4 loads of 16 bytes
// per thread and then a store whose address could alias the next loads, so every vector waited out a full
// memory latency (6-13 GB/s per block measured on the H200). Here every iteration issues all of its loads
// (kInFlight vectors of every source) before the first add or store, pointers are __restrict__, and the
// summation order is fixed (sources in the order given, fp32), so a reduction gives the same bits whichever
// blocks or how many run it.
//
// Memory ordering: these are plain loads and stores. The caller acquires the data first (a wait_until by one
// thread, then a block barrier) and publishes the result afterwards (block barrier, then a release signal by
// one thread), as every role in kernels/src does; docs/memory-model.md has the contract.
//
// Used by the TP reduce-scatter / all-reduce / all-gather roles (kernels/src/fused); usable by any persistent
// role that moves or sums row slices (MoE combine, ring attention's K/V hand-off).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace tandem::kernels::roles {

// 16 bytes = 8 elements of a 16-bit type <-> 8 floats.
template <class T>
struct Vec8;
template <>
struct Vec8<__nv_bfloat16> {
  static __device__ __forceinline__ void to_float(const uint4& x, float* f) {
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
  static __device__ __forceinline__ uint4 from_float(const float* f) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
      w[i] = *reinterpret_cast<uint32_t*>(&h);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
};
template <>
struct Vec8<__half> {
  static __device__ __forceinline__ void to_float(const uint4& x, float* f) {
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
  static __device__ __forceinline__ uint4 from_float(const float* f) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
      w[i] = *reinterpret_cast<uint32_t*>(&h);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
};

// A 16-byte load, plain or "streaming" (ld.global.cs: cached with evict-first priority, for data read once).
// A reduction beside a GEMM reads every peer's partial exactly once; with the streaming hint those lines are the
// first the L2 gives up, not the GEMM role's operand tiles that the SMs beside it re-read (the fused GEMM+RS/AR's
// GEMM role ran 1.2-1.5x slower beside its reductions on the H200 and H100, docs/results.md). A hint only: the
// memory model is a plain weak load's (docs/memory-model.md). Chosen at compile time: a run-time choice kept two
// copies of the unrolled loops (or a select per load) and spilled more registers in every GEMM+RS kernel.
template <bool kStreaming>
__device__ __forceinline__ uint4 load16(const uint4* p) {
  if constexpr (kStreaming) {
    return __ldcs(p);
  } else {
    return *p;
  }
}

// Bytes of loads in flight per thread in reduce_vectors, whatever the number of sources: the caller's choice,
// because the best value depends on the kernel around the loop. A reduction alone (the unfused mode's collective)
// is bound by how many loads are outstanding: 128 bytes a thread; 64 made it 7-37 % slower (H100, worlds 2 and 4,
// docs/results.md "rs_inflight"). Beside a GEMM role, which sets the kernel's register budget, 128 bytes spilled
// the loaded vectors and source pointers to local memory (the fused GEMM+RS in pieces: 545-578 local loads in its
// SASS, 177-202 in these loops; 296-301 and 32 at 64 bytes), and 64 ran 2-10 % faster at world 2, the same at 4.
constexpr int kReduceInFlightBytes = 128;        // the reduction alone
constexpr int kReduceInFlightBytesBesideGemm = 64;  // the fused kernels in pieces

// Vectors in flight per thread and source for kBytes a thread: 16-byte vectors, at least one per source.
template <int kSources, int kBytes>
constexpr int in_flight() {
  static_assert(kBytes % 16 == 0 && kBytes >= 16, "whole 16-byte vectors");
  return kSources >= kBytes / 16 ? 1 : (kBytes / 16) / kSources;
}

// Block-wide copy of vectors [lo, hi): kUnroll 16-byte loads per thread issued before their stores.
template <int kUnroll = 8>
__device__ __forceinline__ void copy_vectors(uint4* __restrict__ dst, const uint4* __restrict__ src, int64_t lo,
                                             int64_t hi) {
  const int64_t stride = blockDim.x;
  int64_t v = lo + threadIdx.x;
  for (; v + (kUnroll - 1) * stride < hi; v += kUnroll * stride) {
    uint4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = src[v + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[v + u * stride] = x[u];
  }
  for (; v < hi; v += stride) dst[v] = src[v];
}

// out[v] = round(src[0][v] + src[1][v] + ... + src[kSources-1][v]) for v in [lo, hi), fp32 adds in that order;
// also written to out2 when it is not null. All kSources x kInFlight loads of an iteration are issued first.
template <class T, int kSources, bool kStreaming = false, int kInFlightBytes = kReduceInFlightBytes>
__device__ __forceinline__ void reduce_vectors(const uint4* const* src, int64_t lo, int64_t hi, uint4* __restrict__ out,
                                               uint4* __restrict__ out2) {
  constexpr int U = in_flight<kSources, kInFlightBytes>();
  const int64_t stride = blockDim.x;
  const uint4* s[kSources];
#pragma unroll
  for (int i = 0; i < kSources; ++i) s[i] = src[i];
  for (int64_t v0 = lo + threadIdx.x; v0 < hi; v0 += U * stride) {
    uint4 x[kSources][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = v0 + u * stride;
      if (v < hi) {
#pragma unroll
        for (int i = 0; i < kSources; ++i) x[i][u] = load16<kStreaming>(s[i] + v);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = v0 + u * stride;
      if (v >= hi) break;
      float acc[8], f[8];
      Vec8<T>::to_float(x[0][u], acc);
#pragma unroll
      for (int i = 1; i < kSources; ++i) {
        Vec8<T>::to_float(x[i][u], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += f[j];
      }
      const uint4 o = Vec8<T>::from_float(acc);
      out[v] = o;
      if (out2 != nullptr) out2[v] = o;
    }
  }
}

// reduce_vectors for a run-time number of sources (1 to 8).
template <class T, bool kStreaming = false, int kInFlightBytes = kReduceInFlightBytes>
__device__ __forceinline__ bool reduce_vectors_n(int nsrc, const uint4* const* src, int64_t lo, int64_t hi, uint4* out,
                                                 uint4* out2) {
  switch (nsrc) {
    case 1: reduce_vectors<T, 1, kStreaming, kInFlightBytes>(src, lo, hi, out, out2); return true;
    case 2: reduce_vectors<T, 2, kStreaming, kInFlightBytes>(src, lo, hi, out, out2); return true;
    case 3: reduce_vectors<T, 3, kStreaming, kInFlightBytes>(src, lo, hi, out, out2); return true;
    case 4: reduce_vectors<T, 4, kStreaming, kInFlightBytes>(src, lo, hi, out, out2); return true;
    case 5: reduce_vectors<T, 5, kStreaming, kInFlightBytes>(src, lo, hi, out, out2); return true;
    case 6: reduce_vectors<T, 6, kStreaming, kInFlightBytes>(src, lo, hi, out, out2); return true;
    case 7: reduce_vectors<T, 7, kStreaming, kInFlightBytes>(src, lo, hi, out, out2); return true;
    case 8: reduce_vectors<T, 8, kStreaming, kInFlightBytes>(src, lo, hi, out, out2); return true;
    default: return false;
  }
}

// One step of a running reduction: acc (fp32, 2 float4 per vector) = [acc +] src, or on the last step
// out = round(acc + src). The source and the accumulator loads of an iteration are all issued first.
template <class T, int kUnroll = 4>
__device__ __forceinline__ void accumulate_vectors(const uint4* __restrict__ src, int64_t lo, int64_t hi,
                                                   float4* __restrict__ acc, bool first, bool last,
                                                   uint4* __restrict__ out, uint4* __restrict__ out2) {
  const int64_t stride = blockDim.x;
  for (int64_t v0 = lo + threadIdx.x; v0 < hi; v0 += kUnroll * stride) {
    uint4 x[kUnroll];
    float4 a[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * stride;
      if (v < hi) {
        x[u] = src[v];
        if (!first) a[u][0] = acc[2 * v], a[u][1] = acc[2 * v + 1];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * stride;
      if (v >= hi) break;
      float f[8];
      Vec8<T>::to_float(x[u], f);
      if (!first) {
        f[0] = a[u][0].x + f[0], f[1] = a[u][0].y + f[1], f[2] = a[u][0].z + f[2], f[3] = a[u][0].w + f[3];
        f[4] = a[u][1].x + f[4], f[5] = a[u][1].y + f[5], f[6] = a[u][1].z + f[6], f[7] = a[u][1].w + f[7];
      }
      if (last) {
        const uint4 o = Vec8<T>::from_float(f);
        out[v] = o;
        if (out2 != nullptr) out2[v] = o;
      } else {
        acc[2 * v] = make_float4(f[0], f[1], f[2], f[3]);
        acc[2 * v + 1] = make_float4(f[4], f[5], f[6], f[7]);
      }
    }
  }
}

}  // namespace tandem::kernels::roles

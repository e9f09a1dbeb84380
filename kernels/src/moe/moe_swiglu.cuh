// MoE: the SwiGLU between the two grouped GEMMs, over the received rows only (moe.h: SwigluArgs has the
// contract). A grid-stride loop of 16-byte vectors: 8 gate and 8 up elements in, 8 out, fp32 math and one rounding,
// x / (1 + expf(-x)) times up, as torch's silu(gate.float()) * up computes it (no fast-math in this library: the
// same expf and the same IEEE division, hence the same bits).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace tandem::kernels::moe {

namespace {

template <class T>
struct SwigluElement;
template <>
struct SwigluElement<__nv_bfloat16> {
  static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 store(float f) { return __float2bfloat16_rn(f); }
};
template <>
struct SwigluElement<__half> {
  static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(float f) { return __float2half_rn(f); }
};

constexpr int kSwigluThreads = 256;
constexpr int kSwigluBlocksPerSm = 8;

template <class T>
__global__ void __launch_bounds__(kSwigluThreads) moe_swiglu_kernel(const T* __restrict__ y,
                                                                    const int32_t* __restrict__ received,
                                                                    int64_t capacity, int inter, T* __restrict__ out) {
  using E = SwigluElement<T>;
  int64_t rows = *received;  // written by the dispatch earlier on this stream
  rows = rows < 0 ? 0 : (rows > capacity ? capacity : rows);
  const int64_t vecs = inter / 8;  // 16-byte vectors a row of out
  const int64_t total = rows * vecs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / vecs;
    const int64_t c = (i - r * vecs) * 8;
    const T* row = y + r * 2 * static_cast<int64_t>(inter);
    const uint4 gate = *reinterpret_cast<const uint4*>(row + c);
    const uint4 up = *reinterpret_cast<const uint4*>(row + inter + c);
    const T* g = reinterpret_cast<const T*>(&gate);
    const T* u = reinterpret_cast<const T*>(&up);
    uint4 res;
    T* o = reinterpret_cast<T*>(&res);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float x = E::load(g[j]);
      o[j] = E::store(x / (1.0f + expf(-x)) * E::load(u[j]));
    }
    *reinterpret_cast<uint4*>(out + r * static_cast<int64_t>(inter) + c) = res;
  }
}

}  // namespace

}  // namespace tandem::kernels::moe

// tandem device API — cooperative byte copy over load/store (NVLink, or the same GPU).
//
// Picks the widest access both pointers allow: 16-byte vectors when src and dst share their alignment modulo
// 16 (head and tail done bytewise), else 4-byte words when they share it modulo 4, else bytes. Vector loads are
// issued kUnroll at a time before the stores so that several transactions are in flight per thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/device/impl/ptx.cuh"

namespace tandem::device::impl {

__device__ __forceinline__ void copy_bytes_strided(char* dst, const char* src, size_t n, int lane, int nthr) {
  for (size_t i = lane; i < n; i += nthr) dst[i] = src[i];
}

__device__ __forceinline__ void copy_words_strided(uint32_t* dst, const uint32_t* src, size_t n, int lane,
                                                   int nthr) {
  for (size_t i = lane; i < n; i += nthr) dst[i] = src[i];
}

template <int kUnroll = 8>
__device__ __forceinline__ void copy_vec16_strided(Vec16* dst, const Vec16* src, size_t n, int lane, int nthr) {
  size_t i = lane;
  const size_t step = static_cast<size_t>(nthr);
  for (; i + (kUnroll - 1) * step < n; i += kUnroll * step) {
    Vec16 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = ld_vec16(src + i + u * step);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) st_vec16(dst + i + u * step, v[u]);
  }
  for (; i < n; i += step) st_vec16(dst + i, ld_vec16(src + i));
}

// Copy n bytes with `nthr` cooperating threads; `lane` in [0, nthr). No synchronization inside.
__device__ __forceinline__ void copy_cooperative(void* dst_v, const void* src_v, size_t n, int lane, int nthr) {
  char* dst = static_cast<char*>(dst_v);
  const char* src = static_cast<const char*>(src_v);
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t s = reinterpret_cast<uintptr_t>(src);
  if (((d ^ s) & 15u) == 0) {
    size_t head = (16u - (d & 15u)) & 15u;
    if (head > n) head = n;
    copy_bytes_strided(dst, src, head, lane, nthr);
    const size_t body = (n - head) / 16;
    copy_vec16_strided(reinterpret_cast<Vec16*>(dst + head), reinterpret_cast<const Vec16*>(src + head), body,
                       lane, nthr);
    const size_t done = head + body * 16;
    copy_bytes_strided(dst + done, src + done, n - done, lane, nthr);
  } else if (((d ^ s) & 3u) == 0) {
    size_t head = (4u - (d & 3u)) & 3u;
    if (head > n) head = n;
    copy_bytes_strided(dst, src, head, lane, nthr);
    const size_t body = (n - head) / 4;
    copy_words_strided(reinterpret_cast<uint32_t*>(dst + head), reinterpret_cast<const uint32_t*>(src + head),
                       body, lane, nthr);
    const size_t done = head + body * 4;
    copy_bytes_strided(dst + done, src + done, n - done, lane, nthr);
  } else {
    copy_bytes_strided(dst, src, n, lane, nthr);
  }
}

}  // namespace tandem::device::impl

// tandem device API — TMA bulk-copy PTX (implementation detail; sm_90+).
#pragma once

#include <cstdint>

namespace tandem::device::impl {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TANDEM_HAS_BULK_COPY 1
#else
#define TANDEM_HAS_BULK_COPY 0
#endif

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if TANDEM_HAS_BULK_COPY
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#endif
}

__device__ __forceinline__ void mbar_inval(uint64_t* bar) {
#if TANDEM_HAS_BULK_COPY
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
#endif
}

__device__ __forceinline__ void mbar_init_fence() {
#if TANDEM_HAS_BULK_COPY
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
#if TANDEM_HAS_BULK_COPY
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 1;
#if TANDEM_HAS_BULK_COPY
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
#endif
  return done != 0;
}

// global -> shared, completing `bytes` of transaction on `bar`.
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
#if TANDEM_HAS_BULK_COPY
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(smem_dst)),
      "l"(gmem_src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
#endif
}

// shared -> global (the destination may be a peer's memory mapped into this address space).
__device__ __forceinline__ void bulk_store(void* gmem_dst, const void* smem_src, uint32_t bytes) {
#if TANDEM_HAS_BULK_COPY
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem_dst),
               "r"(smem_addr(smem_src)), "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void bulk_commit() {
#if TANDEM_HAS_BULK_COPY
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// Wait until at most N committed store groups still read shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
#if TANDEM_HAS_BULK_COPY
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
#endif
}

// Wait until every committed store group has completed, then order those async-proxy writes before later
// generic-proxy operations (the signal that publishes them).
__device__ __forceinline__ void bulk_wait_all() {
#if TANDEM_HAS_BULK_COPY
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

}  // namespace tandem::device::impl

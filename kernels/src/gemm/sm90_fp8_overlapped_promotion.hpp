// The FP8 GEMM's mainloop with its promotion overlapped (sm90a; scaled_gemm_sm90.cu's 128-wide configurations).
//
// Why: e4m3 wgmma accumulates in reduced precision, so an FP8 GEMM without "fast accumulation" (torch._scaled_mm's
// default, and tandem's contract: scaled_gemm.h) adds the tensor core's partial sums into fp32 accumulators every
// 128 of K (the promotion). CUTLASS's FP8 mainloop keeps one partial register tile and, before each add, waits for
// every wgmma in flight (warpgroup_wait<0>): once per k-tile of 128 the warp group's tensor core work drains, the
// adds run, and only then does the next k-tile's wgmma issue. tandem's FP8 GEMM ran 0.81-0.90 of cuBLASLt's
// tensor-wise kernels at M >= 1024 with N or K >= 14336 on an H100, also with 20 calls back to back (device time,
// not the host's; docs/results.md, 2026-12-06).
//
// Here two partial tiles alternate: k-tile t's wgmmas write partial[t % 2] while partial[(t - 1) % 2], complete
// after warpgroup_wait<1>, is added into the main accumulators and its shared-memory stage released; so the adds,
// the stage release and the next barrier wait run while the tensor core works on the k-tile after. The arithmetic
// is the same and in the same order (each k-tile's four k32 steps from zero in the tensor core, then accum +=
// that, the first k-tile's copied), so the bits equal the one-partial mainloop's. The price is a third fp32 tile
// of registers: 3 x 64 a consumer thread for 128x128 cooperative and 64x128 ping-pong tiles (the 128x192 tiles'
// 3 x 96 do not fit in 232 registers; they keep CUTLASS's mainloop).
//
// Everything but mma() is CUTLASS's collective (TMA loads, pipeline, shared-memory layouts, mma_tail): the kernel
// layer (GemmUniversal, by the dispatch policy's schedule) calls this mma() where it would call the base's.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace tandem::kernels::gemm::detail {

template <class Base>
struct Fp8OverlappedPromotionMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;

  // One k-tile is one promotion interval: 128 of K, the interval CUTLASS's mainloop is run with here (its default
  // mma_promotion_interval of 4 wgmma k-steps of 32), so the sums are the same.
  static_assert(cute::size<2>(typename Base::TileShape{}) == 128, "a k-tile of 128 is one promotion interval");

  // The base's contract: consume k_tile_count stages from smem_pipe_read, leave the product in accum, release every
  // stage but the last (the base's mma_tail releases that one once every wgmma has completed).
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const auto warp_groups = make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto slice = tiled_mma.get_slice(warp_groups(warp_group));
    Tensor descriptors_a = slice.make_fragment_A(slice.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    Tensor descriptors_b = slice.make_fragment_B(slice.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
    Tensor partial0 = make_fragment_like(accum);
    Tensor partial1 = make_fragment_like(accum);

    if (k_tile_count <= 0) {  // no K for this work unit: the product is zero
      clear(accum);
      return;
    }
    PipelineState smem_pipe_release = smem_pipe_read;

    // The next k-tile into `partial`: wait for its stage, issue its wgmmas (the first from zero), commit the batch.
    auto issue = [&](auto& partial) {
      auto token = pipeline.consumer_try_wait(smem_pipe_read);
      pipeline.consumer_wait(smem_pipe_read, token);
      const int stage = smem_pipe_read.index();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(partial);  // earlier reads of this partial stay before the wgmma that overwrites it
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(descriptors_a); ++k_block) {
        cute::gemm(tiled_mma, descriptors_a(_, _, k_block, stage), descriptors_b(_, _, k_block, stage), partial);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(partial);
      ++smem_pipe_read;
    };
    // After warpgroup_wait: `partial`'s k-tile is complete; add it into (or, the first, copy it to) accum.
    auto promote = [&](auto& partial, auto first) {
      warpgroup_fence_operand(partial);  // its reads stay after the wait
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) {
        if constexpr (decltype(first)::value) {
          accum(i) = partial(i);
        } else {
          accum(i) += partial(i);
        }
      }
      warpgroup_fence_operand(partial);
    };
    // ... and its shared-memory stage goes back to the producer (every stage but the last: mma_tail's)
    auto release = [&] {
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    };

    issue(partial0);  // k-tile 0
    if (k_tile_count == 1) {
      warpgroup_wait<0>();
      promote(partial0, cute::true_type{});
      return;
    }
    issue(partial1);  // k-tile 1
    warpgroup_wait<1>();
    promote(partial0, cute::true_type{});
    release();
    // k-tiles 2.. in pairs: while one partial fills, the other (the k-tile before) is added
    int remaining = k_tile_count - 2;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; remaining >= 2; remaining -= 2) {
      issue(partial0);
      warpgroup_wait<1>();
      promote(partial1, cute::false_type{});
      release();
      issue(partial1);
      warpgroup_wait<1>();
      promote(partial0, cute::false_type{});
      release();
    }
    if (remaining == 1) {
      issue(partial0);
      warpgroup_wait<1>();
      promote(partial1, cute::false_type{});
      release();
      warpgroup_wait<0>();
      promote(partial0, cute::false_type{});
    } else {
      warpgroup_wait<0>();
      promote(partial1, cute::false_type{});
    }
  }
};

}  // namespace tandem::kernels::gemm::detail

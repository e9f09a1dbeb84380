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
// 3 x 96 do not fit in 232 registers; they overlap half-tile batches instead: Fp8SplitPromotionMainloop below).
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

// The same overlap for tiles whose third partial tile does not fit (128x192 cooperative, 64x192 ping-pong: 3 x 96
// fp32 registers a consumer thread against 232): each k-tile's wgmmas are issued as two batches, the N halves of the
// tile, into two half-size partial tiles (2 x 48 registers: the same 192 as CUTLASS's one full partial beside the
// accumulators). While one half's batch runs on the tensor core, the other half of the previous batch is added:
//
//   issue (t, lo); issue (t, hi)  ...  wait<1>: (t, lo) done -> accum_lo += partial_lo; issue (t+1, lo)
//                                      wait<1>: (t, hi) done -> accum_hi += partial_hi, release stage t; issue (t+1, hi)
//
// so one batch is always in flight during the adds. The halves are wgmmas of N / 2 (a tiled MMA of the base's
// operation at half the N, the same warp groups); each sums its k-tile's four k32 steps from zero and is then added
// to its half of the accumulators: the same arithmetic, in the same order, as CUTLASS's mainloop (the same bits).
// A wgmma accumulator fragment holds its values column group by column group (value mode (2, 2, N / 8), the
// groups outermost), so the base's accum in flat order is the lo half's 48 values a thread, then the hi half's.
//
// STATUS: ran on an H100 (2026-12-06, 620c705: its 13 FP8 tests passed, then merged; docs/results.md). Why the loop
// is shaped as it is: as first written (both waits of the k-tile loop
// wait<1>), ptxas (nvcc 13.0) reported C7514 for every kernel ("wgmma.mma_async instructions are serialized due to
// non wgmma instructions reading accumulator registers of a wgmma between start and end of the pipeline stage") and
// serialized every QGMMA. Bisected on one kernel (128x192 cooperative, tensor-wise; 46 s a compile, PTX scanned for
// accumulator reads between each wgmma and its wait): the PTX is clean (every read of a half partial follows the
// wait that retires its batch), and the warning goes away exactly when the loop's first wait, the one before
// promote(hi), is wait<0>; with wait<1> there it stays whatever else changes: the pre-loop's identical sequence,
// the halves swapped, a consumer wait in both halves, the loop unrolled by two, the loop rotated to start with a
// wait, a 128x128 tile (64 accumulators a thread: not register pressure). The loop below therefore overlaps only
// the lo half's adds (with the hi batch); the hi half's adds wait for the lo batch of the next k-tile. Why ptxas
// accepts the same pattern in Fp8OverlappedPromotionMainloop's loop and not here is not known.
template <class Base>
struct Fp8SplitPromotionMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;

  static constexpr int kTileM = cute::size<0>(typename Base::TileShape{});
  static constexpr int kTileN = cute::size<1>(typename Base::TileShape{});
  static constexpr int kTileK = cute::size<2>(typename Base::TileShape{});
  static_assert(kTileK == 128, "a k-tile of 128 is one promotion interval");
  static_assert(kTileN % 16 == 0, "two halves of whole wgmma N granules");
  static constexpr int kWarpGroups = cute::size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
  // The base's wgmma (e4m3 x e4m3 -> f32, both K-major) at half the tile's N, on the same warp-group layout.
  using HalfMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<typename Base::ElementA, typename Base::ElementB, float,
                                 cute::Shape<cute::Int<kTileM>, cute::Int<kTileN / 2>, cute::Int<kTileK>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      cute::Layout<cute::Shape<cute::Int<kWarpGroups>, cute::_1, cute::_1>>{}));

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
    const auto warp_groups = make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    HalfMma half_mma;
    auto slice = half_mma.get_slice(warp_groups(warp_group));
    Tensor descriptors_a = slice.make_fragment_A(slice.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    Tensor descriptors_b = slice.make_fragment_B(slice.partition_B(sB));  // (MMA, 2, MMA_K, PIPE): the N halves
    static_assert(decltype(size<1>(descriptors_b))::value == 2, "B partitions into the two N halves");
    Tensor partial_lo = partition_fragment_C(half_mma, Shape<Int<kTileM>, Int<kTileN / 2>>{});  // (MMA, MMA_M, 1)
    Tensor partial_hi = partition_fragment_C(half_mma, Shape<Int<kTileM>, Int<kTileN / 2>>{});
    static_assert(decltype(size(partial_lo))::value * 2 == decltype(size(accum))::value,
                  "the halves hold the accumulators' values");
    constexpr int kHalf = decltype(size(partial_lo))::value;

    if (k_tile_count <= 0) {  // no K for this work unit: the product is zero
      clear(accum);
      return;
    }
    PipelineState smem_pipe_release = smem_pipe_read;
    int stage = 0;
    // Both partials defined before the first wgmma: their wgmmas start from zero (ScaleOut::Zero) but name them as
    // inputs, and without this the compiler materialized partial_hi's registers between the lo batch's wgmmas and
    // its wait (not by itself the cause of C7514: STATUS above).
    clear(partial_lo);
    clear(partial_hi);
    warpgroup_fence_operand(partial_lo);
    warpgroup_fence_operand(partial_hi);

    // Half h of the current k-tile into `partial` (h = 0 first waits for the k-tile's stage), as one batch.
    auto issue = [&](auto& partial, auto h) {
      if constexpr (decltype(h)::value == 0) {
        auto token = pipeline.consumer_try_wait(smem_pipe_read);
        pipeline.consumer_wait(smem_pipe_read, token);
        stage = smem_pipe_read.index();
      }
      half_mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(partial);  // earlier reads of this partial stay before the wgmma that overwrites it
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(descriptors_a); ++k_block) {
        // B's descriptors of half h as an (MMA, 1) tensor: the rank-3 gemm on the whole partial, as the overlapped
        // mainloop calls it
        Tensor b_k = descriptors_b(_, _, k_block, stage);  // (MMA, 2)
        Tensor b_half = make_tensor(b_k.data() + b_k.layout()(0, h),
                                    make_layout(make_shape(size<0>(b_k), _1{}), make_stride(stride<0>(b_k), _0{})));
        cute::gemm(half_mma, descriptors_a(_, _, k_block, stage), b_half, partial);
        half_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(partial);
      if constexpr (decltype(h)::value == 1) ++smem_pipe_read;
    };
    // After warpgroup_wait: half h's batch is complete; add it into (or, the first k-tile, copy it to) its half of
    // accum (flat values [h x kHalf, (h + 1) x kHalf)).
    // (first is a compile-time flag, as in Fp8OverlappedPromotionMainloop: a run-time branch between a wgmma's issue
    // and its wait made ptxas serialize the wgmmas, C7514)
    auto promote = [&](auto& partial, auto h, auto first) {
      warpgroup_fence_operand(partial);  // its reads stay after the wait
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kHalf; ++i) {
        if constexpr (decltype(first)::value) {
          accum(decltype(h)::value * kHalf + i) = partial(i);
        } else {
          accum(decltype(h)::value * kHalf + i) += partial(i);
        }
      }
      warpgroup_fence_operand(accum);
      warpgroup_fence_operand(partial);
    };
    // ... and, once both halves of a k-tile are in, its shared-memory stage goes back to the producer (every stage
    // but the last: mma_tail's)
    auto release = [&] {
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    };
    using Lo = cute::Int<0>;
    using Hi = cute::Int<1>;

    issue(partial_lo, Lo{});  // k-tile 0
    issue(partial_hi, Hi{});
    warpgroup_wait<1>();
    promote(partial_lo, Lo{}, cute::true_type{});
    if (k_tile_count == 1) {
      warpgroup_wait<0>();
      promote(partial_hi, Hi{}, cute::true_type{});
      return;
    }
    issue(partial_lo, Lo{});  // k-tile 1, while k-tile 0's hi half runs
    warpgroup_wait<1>();
    promote(partial_hi, Hi{}, cute::true_type{});
    release();  // k-tile 0 fully read
    issue(partial_hi, Hi{});  // while k-tile 1's lo half runs
    warpgroup_wait<1>();
    promote(partial_lo, Lo{}, cute::false_type{});
    CUTLASS_PRAGMA_NO_UNROLL
    for (int t = 2; t < k_tile_count; ++t) {
      issue(partial_lo, Lo{});  // k-tile t
      // wait<0>, not wait<1>: with wait<1> here ptxas serializes every wgmma (C7514; STATUS above), so the hi
      // half's adds do not overlap this lo batch
      warpgroup_wait<0>();
      promote(partial_hi, Hi{}, cute::false_type{});
      release();  // k-tile t - 1 fully read
      issue(partial_hi, Hi{});  // while k-tile t's lo half runs
      warpgroup_wait<1>();
      promote(partial_lo, Lo{}, cute::false_type{});
    }
    warpgroup_wait<0>();
    promote(partial_hi, Hi{}, cute::false_type{});
  }
};

}  // namespace tandem::kernels::gemm::detail

// tandem kernels (private) — the GEMM configurations the fused TP kernels' GEMM roles may run, besides the core's
// (gemm::detail::CooperativeConfig, 128x256 tiles in 2x1 clusters), chosen at launch by TANDEM_TP_GEMM_TILE.
#pragma once

#include "../gemm/sm90_config.hpp"

namespace tandem::kernels::tp::detail {

// 256x128 tiles, 2x1 clusters, cooperative (TANDEM_TP_GEMM_TILE=256x128, with tile claims): under MPS the core's
// cooperative 256x128 took 0.84x cuBLAS's time at a rank GEMM where 128x256 took 0.90x (tools/diag/gemm_mps.py,
// H200, world 4, 16384x8192x1024, 2026-12-04), and the fused GEMM roles ran 128x256 only. (1-CTA clusters were
// tried for AG+GEMM and were slower, with the same late blocks under MPS: tools/pending/ag-cluster1.diff.)
using Tile256x128Config = gemm::detail::Sm90Config<256, 128, 2, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                                   cutlass::epilogue::TmaWarpSpecializedCooperative>;

template <class Config>
inline constexpr int kConfigTileM = static_cast<int>(decltype(cute::size<0>(typename Config::TileShape{}))::value);
template <class Config>
inline constexpr int kConfigTileN = static_cast<int>(decltype(cute::size<1>(typename Config::TileShape{}))::value);

}  // namespace tandem::kernels::tp::detail

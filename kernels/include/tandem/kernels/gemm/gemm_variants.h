// tandem kernels — other configurations of the Hopper GEMM core, for measurement only (bf16).
//
// The core (gemm.h) is one CUTLASS configuration: 128x256x64 tiles, 2x1 clusters, cooperative. Under MPS, on a
// rank's share of the SMs, it ran at about half of cuBLAS's rate (docs/results.md, issue 21) while it matched
// cuBLAS on a whole GPU. These variants, the occupancy queries and the residency probe below let one device run
// tell which of tile, cluster or schedule is at fault (tools/diag/gemm_mps.py), before the core changes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/kernels/gemm/gemm.h"

namespace tandem::kernels::gemm::variants {

// "coop_128x256_c2" (the core's configuration), "coop_128x256_c1", "coop_256x128_c1", "pingpong_128x128_c1",
// "pingpong_128x128_c2": schedule_tile_cluster (c2 = clusters of 2 CTAs along M). Split along K (CUTLASS's
// stream-K scheduler; the partial tiles are summed in fp32 in the workspace, in a fixed order: deterministic, but
// not the unsplit configurations' bits): "splitk2_128x128_c1", "splitk4_128x128_c1" (K in 2 or 4 slices),
// "streamk_128x128_c1", "streamk_128x256_c1" (K iterations balanced over the grid). "coop_128x256_c1x2" (a cluster
// of 2 CTAs along N: they share their A tiles) and "coop_256x128_c2". Swapped ("swap_" + the problem's tile M x N:
// the kernel computes D^T = B^T A^T, its tile N over the problem's M): "swap_coop_256x128_c1" and
// "swap_coop_208x128_c2" (pairs along M).
std::vector<std::string> names();

// D = A @ B with variant `name` (bf16 only; args.dtype must be kBF16). Persistent grid sized to args.sm_count.
// `workspace`: device memory of workspace_size() bytes (16-byte aligned; none needed where that is 0), used by
// this launch until it completes; run() zeroes what it needs of it on `stream` first.
Status run(const std::string& name, const GemmArgs& args, cudaStream_t stream, std::string* why = nullptr,
           void* workspace = nullptr);

// Bytes of workspace run() needs for these arguments (0 for the unsplit variants).
Status workspace_size(const std::string& name, const GemmArgs& args, size_t* bytes, std::string* why = nullptr);

struct Occupancy {
  int grid_ctas = 0;            // CTAs the persistent grid launches for args.sm_count
  int cluster_size = 0;         // CTAs a cluster
  int max_active_clusters = 0;  // cudaOccupancyMaxActiveClusters for that launch (what the driver says fits)
  int smem_bytes = 0;           // dynamic shared memory a CTA
};
Status occupancy(const std::string& name, const GemmArgs& args, Occupancy* out, std::string* why = nullptr);

// Residency probe: `blocks` CTAs in clusters of `cluster_x`, each with `smem_bytes` of dynamic shared memory,
// each recording [globaltimer at start, globaltimer at end, SM id] into timeline[3 * block] (device memory,
// int64) after spinning `spin_us`. The largest number of overlapping [start, end) intervals is how many CTAs of
// such a launch were resident at once.
Status residency_probe(int blocks, int cluster_x, int smem_bytes, int spin_us, int64_t* timeline, cudaStream_t stream,
                       std::string* why = nullptr);

// Where a GEMM launch's host time goes (tools/diag/gemm_host_path.py; issue 23): microseconds a call, the median
// of `reps` batches of 20 calls each, of the pieces of a launch, timed on the host (std::chrono, nothing waited for
// but the launches' enqueue): the driver lookup of cuTensorMapEncodeTiled by name (what CUTLASS's wrapper did per
// descriptor), one descriptor encode through the forwarder resolved once (what it does now), cudaFuncSetAttribute
// of the dynamic shared memory (what initialize() did per launch) and the cached check that replaced it, the
// coop_128x256_c2 configuration's kernel parameters at 4096^3 (to_underlying_arguments: its TMA descriptors), and
// an empty kernel's launch, plain (<<<>>>) and as 2-CTA clusters (cudaLaunchKernelEx, CUTLASS's Hopper launch).
struct HostCosts {
  double entry_point_lookup_us = 0, tensor_map_encode_us = 0, func_set_attribute_us = 0, dynamic_smem_cached_us = 0,
         gemm_params_us = 0, launch_plain_us = 0, launch_cluster_us = 0;
};
Status host_costs(int reps, cudaStream_t stream, HostCosts* out, std::string* why = nullptr);

}  // namespace tandem::kernels::gemm::variants

// The fused TP kernels' host-side knobs and diagnostics, shared by AG+GEMM and GEMM+RS/AR: the environment
// knobs (FusedKnobs, tile claims), the optional per-block timeline buffer, and what the last fused launch took.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tp_common.cuh"

namespace tandem::kernels::tp {

namespace detail {

namespace {
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}
uint64_t* g_timeline = nullptr;  // host: the device buffer, made on the first traced launch
}  // namespace
int g_last_fused_pieces = 0;
bool g_last_fused_claims = false;
int g_last_fused_gemm_tile_m = 0;
bool g_last_fused_joined = false;
bool g_last_fused_ring = false;
bool g_last_fused_ticket = false;

bool tile_claims_enabled() { return !env_is("TANDEM_TP_CLAIM", "0"); }

uint64_t* timeline_for_launch(cudaStream_t stream) {
  if (!env_is("TANDEM_TP_TRACE", "1")) return nullptr;
  const size_t bytes = sizeof(uint64_t) * runtime::kTimelineBlocks * runtime::kTimelineSlots;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone)
    return nullptr;  // no allocation (nor a memset node) inside a capture: graph replays are not traced
  if (g_timeline == nullptr && cudaMalloc(&g_timeline, bytes) != cudaSuccess) {
    g_timeline = nullptr;
    return nullptr;
  }
  return cudaMemsetAsync(g_timeline, 0, bytes, stream) == cudaSuccess ? g_timeline : nullptr;
}

FusedKnobs FusedKnobs::from_env() {
  FusedKnobs k;
  if (const char* v = std::getenv("TANDEM_TP_SWIZZLE")) {
    const int s = std::atoi(v);
    k.swizzle = s == 2 || s == 4 || s == 8 ? s : 1;
  }
  k.raster_m = env_is("TANDEM_TP_RASTER", "m");
  k.common_order = env_is("TANDEM_RS_ORDER", "common");
  k.one_pass = env_is("TANDEM_RS_REDUCE", "onepass");
  if (const char* v = std::getenv("TANDEM_RS_PIECES")) k.pieces = std::strcmp(v, "auto") == 0 ? -1 : std::atoi(v);
  k.join = env_is("TANDEM_RS_JOIN", "1");
  k.gemm_tile_m = env_is("TANDEM_TP_GEMM_TILE", "256x128") ? 256 : 128;
  k.ring = env_is("TANDEM_RS_RING", "1");
  k.ticket = env_is("TANDEM_RS_TICKET", "1");
  if (const char* v = std::getenv("TANDEM_RS_TICKET_END_WAITERS")) k.ticket_end_waiters = std::atoi(v);
  k.ticket_direct = !env_is("TANDEM_RS_TICKET_DIRECT", "0");
  if (const char* v = std::getenv("TANDEM_RS_TICKET_ROUNDS")) k.ticket_rounds = std::atoi(v);
  runtime::late_blocks_from_env("TANDEM_TP_LATE", &k.late_cluster, &k.late_us);
  return k;
}

}  // namespace detail

cudaError_t timeline_snapshot(std::vector<uint64_t>* out) {
  out->clear();
  if (detail::g_timeline == nullptr) return cudaSuccess;
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return e;
  out->assign(static_cast<size_t>(runtime::kTimelineBlocks) * runtime::kTimelineSlots, 0);
  return cudaMemcpy(out->data(), detail::g_timeline, sizeof(uint64_t) * out->size(), cudaMemcpyDeviceToHost);
}

int timeline_slots() { return runtime::kTimelineSlots; }
int last_fused_rs_pieces() { return detail::g_last_fused_pieces; }
bool last_fused_claims() { return detail::g_last_fused_claims; }
int last_fused_gemm_tile_m() { return detail::g_last_fused_gemm_tile_m; }
bool last_fused_rs_joined() { return detail::g_last_fused_joined; }
bool last_fused_rs_ring() { return detail::g_last_fused_ring; }
bool last_fused_rs_ticket() { return detail::g_last_fused_ticket; }

}  // namespace tandem::kernels::tp

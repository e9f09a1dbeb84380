// tandem kernels — an optional per-block timeline for persistent kernels (a diagnostic, off by default).
//
// Why: a fused kernel's time is the sum of what its roles wait for and what they do, and neither CUDA events nor
// a profiler under MPS says which. A kernel given a Timeline writes, per block, the global timer (ns) at the
// points it names (slots), and the SM it ran on; the host reads the buffer back after the launch. The global
// timer is one clock for every process on a GPU, so the MPS ranks' timelines line up.
//
// Contract: a timeline has Blocks rows of Slots words (TimelineOf<Blocks, Slots, RecordSm>; Timeline, the TP
// kernels', is 256 x 48 with the SM in its last slot; MoE's dispatch is 512 x 8 without it). stamp() writes slots
// 0 .. kStampSlots-1 (all of them, or all but the last where that holds the SM id); blocks past Blocks are not
// recorded; thread 0 of a block stamps (call it where every thread passes, or from thread 0). row() gives a block's
// row to code that keeps its own words there (MoE's GEMM scheduler adds its waits up in two slots). A null buffer
// (the default) costs one predicated branch per stamp and no stores. Plain stores: read the buffer only after
// the launch completed (stream synchronization orders them). The host owns the buffer (Blocks x Slots words,
// zeroed before the launch) and passes it in the kernel's parameters: no __device__ state.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/device.cuh"

namespace tandem::kernels::runtime {

constexpr int kTimelineSlots = 48;    // per block; the last is the SM id
constexpr int kTimelineBlocks = 256;  // blocks recorded (a grid row-major index below this)

template <int Blocks, int Slots, bool RecordSm = true>
struct TimelineOf {
  static constexpr int kBlocks = Blocks;
  static constexpr int kSlots = Slots;
  static constexpr int kStampSlots = RecordSm ? Slots - 1 : Slots;  // the slots stamp() writes
  static constexpr size_t kWords = static_cast<size_t>(Blocks) * Slots;
  static_assert(Blocks > 0 && kStampSlots > 0, "a timeline has blocks and slots to stamp");

  uint64_t* stamps = nullptr;  // kBlocks x kSlots, zeroed before the launch; null: off

  __device__ __forceinline__ bool on() const { return stamps != nullptr; }

  // The calling block's row (any thread), or null: off, or a block past kBlocks.
  __device__ __forceinline__ uint64_t* row() const {
    const unsigned b = blockIdx.y * gridDim.x + blockIdx.x;
    if (stamps == nullptr || b >= static_cast<unsigned>(kBlocks)) return nullptr;
    return stamps + static_cast<size_t>(b) * kSlots;
  }

  // Thread 0: slot <- now (ns). With RecordSm, the first call of a block also records its SM.
  __device__ __forceinline__ void stamp(int slot) const {
    if (stamps == nullptr || threadIdx.x != 0) return;
    const unsigned b = blockIdx.y * gridDim.x + blockIdx.x;
    if (b >= static_cast<unsigned>(kBlocks) || slot < 0 || slot >= kStampSlots) return;
    uint64_t* row = stamps + static_cast<size_t>(b) * kSlots;
    row[slot] = tandem::device::now_ns();
    if constexpr (RecordSm) {
      unsigned smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      row[kSlots - 1] = smid + 1;  // 0 = the block never ran a stamp
    }
  }
};

// The TP kernels' timeline (TANDEM_TP_TRACE=1, tools/diag/tp_trace.py).
using Timeline = TimelineOf<kTimelineBlocks, kTimelineSlots>;

}  // namespace tandem::kernels::runtime

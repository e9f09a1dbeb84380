// tandem kernels — an optional per-block timeline for persistent kernels (a diagnostic, off by default).
//
// Why: a fused kernel's time is the sum of what its roles wait for and what they do, and neither CUDA events nor
// a profiler under MPS says which. A kernel given a Timeline writes, per block, the global timer (ns) at the
// points it names (slots), and the SM it ran on; the host reads the buffer back after the launch. The global
// timer is one clock for every process on a GPU, so the MPS ranks' timelines line up.
//
// Contract: slots are 0 .. kTimelineSlots-2 (the last slot holds the SM id); blocks past kTimelineBlocks are not
// recorded; thread 0 of a block stamps (call it where every thread passes, or from thread 0). A null buffer
// (the default) costs one predicated branch per stamp and no stores. Plain stores: read the buffer only after
// the launch completed (stream synchronization orders them).
#pragma once

#include <cstdint>

#include "tandem/device.cuh"

namespace tandem::kernels::runtime {

constexpr int kTimelineSlots = 48;    // per block; the last is the SM id
constexpr int kTimelineBlocks = 256;  // blocks recorded (a grid row-major index below this)

struct Timeline {
  uint64_t* stamps = nullptr;  // kTimelineBlocks x kTimelineSlots, zeroed before the launch; null: off

  __device__ __forceinline__ bool on() const { return stamps != nullptr; }

  // Thread 0: slot <- now (ns). The first call of a block also records its SM.
  __device__ __forceinline__ void stamp(int slot) const {
    if (stamps == nullptr || threadIdx.x != 0) return;
    const unsigned b = blockIdx.y * gridDim.x + blockIdx.x;
    if (b >= static_cast<unsigned>(kTimelineBlocks) || slot < 0 || slot >= kTimelineSlots - 1) return;
    uint64_t* row = stamps + static_cast<size_t>(b) * kTimelineSlots;
    row[slot] = tandem::device::now_ns();
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    row[kTimelineSlots - 1] = smid + 1;  // 0 = the block never ran a stamp
  }
};

}  // namespace tandem::kernels::runtime

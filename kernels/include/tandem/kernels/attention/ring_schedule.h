// Ring attention's slot schedule (host and device): which slot each step uses, and the global step at which a
// slot's previous use ended. The kernel's flow control is built on these two functions; the CPU tests replay the
// protocol over many launches with them (tests/cpu/test_ring_schedule.py, through the bindings).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_RING_HD __host__ __device__ __forceinline__
#else
#define TANDEM_RING_HD inline
#endif

namespace tandem::kernels::attention::schedule {

// Step i of a launch (i in [0, world)) holds the K/V block of rank (rank - i) mod world in slot i mod slots.
TANDEM_RING_HD int slot_of(int step, int slots) { return step % slots; }

// Global step number of step i in launch `epoch` (epochs count from 1): flags carry it, so they only grow.
TANDEM_RING_HD uint64_t global_step(uint64_t epoch, int world, int step) {
  return epoch * static_cast<uint64_t>(world) + static_cast<uint64_t>(step);
}

// Before step i's block may be written into a rank's slot, that rank must have released the slot's previous use:
// step i - slots of this launch, or else the last step of the previous launch with the same slot (0: none).
TANDEM_RING_HD uint64_t previous_use(uint64_t epoch, int world, int slots, int step) {
  if (step >= slots) return global_step(epoch, world, step - slots);
  if (epoch <= 1) return 0;
  int last = world - 1;
  while (last >= 0 && slot_of(last, slots) != slot_of(step, slots)) --last;
  return last < 0 ? 0 : global_step(epoch - 1, world, last);
}

}  // namespace tandem::kernels::attention::schedule

// tandem device API — cooperative groups as compile-time tags (implementation detail).
#pragma once

#include "tandem/device/types.cuh"

namespace tandem::device::impl {

template <Group G>
struct GroupTraits;

template <>
struct GroupTraits<Group::kThread> {
  __device__ static int index() { return 0; }
  __device__ static int size() { return 1; }
  __device__ static void sync() {}
};

template <>
struct GroupTraits<Group::kWarp> {
  __device__ static int index() { return static_cast<int>(threadIdx.x & 31u); }
  __device__ static int size() { return 32; }
  __device__ static void sync() { __syncwarp(); }
};

template <>
struct GroupTraits<Group::kBlock> {
  __device__ static int index() {
    return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  }
  __device__ static int size() { return static_cast<int>(blockDim.x * blockDim.y * blockDim.z); }
  __device__ static void sync() { __syncthreads(); }
};

}  // namespace tandem::device::impl

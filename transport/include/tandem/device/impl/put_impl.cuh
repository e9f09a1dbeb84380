// tandem device API — put family (implementation).
#pragma once

#include "tandem/device/impl/addressing.cuh"
#include "tandem/device/impl/bulk.cuh"
#include "tandem/device/impl/copy.cuh"
#include "tandem/device/impl/group.cuh"
#include "tandem/device/impl/proxy_impl.cuh"
#include "tandem/device/put.cuh"
#include "tandem/device/signal.cuh"

namespace tandem::device {

__device__ __forceinline__ void* peer_ptr(const DeviceComm& comm, const void* sym, int peer) {
  if (peer < 0 || peer >= comm.world) return nullptr;
  const uint64_t base = impl::peer_heap_base(comm, peer);
  if (base == 0) return nullptr;  // no load/store path
  return reinterpret_cast<char*>(base) + (static_cast<const char*>(sym) - comm.heap_base);
}

__device__ __forceinline__ bool is_load_store_peer(const DeviceComm& comm, int peer) {
  return peer >= 0 && peer < comm.world && impl::peer_heap_base(comm, peer) != 0;
}

template <Group G>
__device__ __forceinline__ Status put(const DeviceComm& comm, void* dst, const void* src, size_t bytes,
                                      int peer) {
  if (bytes == 0) return Status::kOk;
  if (impl::is_proxy_peer(comm, peer)) {  // another node: the group's first thread hands it to the proxy
    impl::GroupTraits<G>::sync();          // the group's writes to `src` precede the publishing release
    if (impl::GroupTraits<G>::index() != 0) return Status::kOk;
    return impl::proxy_enqueue(comm, proxy::CommandOp::kPut, peer, src, dst, bytes, nullptr, 0, 0);
  }
  Status status = Status::kOk;
  char* remote = impl::checked_peer_ptr(comm, dst, bytes, peer, DeviceOp::kPut, &status);
  if (remote == nullptr) return status;
  impl::copy_cooperative(remote, src, bytes, impl::GroupTraits<G>::index(), impl::GroupTraits<G>::size());
  return Status::kOk;
}

template <Group G>
__device__ __forceinline__ Status put_signal(const DeviceComm& comm, void* dst, const void* src, size_t bytes,
                                             uint64_t* sig, uint64_t value, SignalOp op, int peer) {
  if (impl::is_proxy_peer(comm, peer)) {  // one command: the remote proxy applies the data, then the signal
    impl::GroupTraits<G>::sync();
    if (impl::GroupTraits<G>::index() != 0) return Status::kOk;
    return impl::proxy_enqueue(comm, proxy::CommandOp::kPutSignal, peer, src, dst, bytes, sig, value,
                               static_cast<uint32_t>(op));
  }
  Status status = put<G>(comm, dst, src, bytes, peer);
  impl::GroupTraits<G>::sync();  // every thread's stores precede the leader's release below
  if (status == Status::kOk && impl::GroupTraits<G>::index() == 0) status = signal(comm, sig, value, op, peer);
  return status;
}

__device__ inline Status put_bulk_block(const DeviceComm& comm, void* dst, const void* src, size_t bytes,
                                        int peer, void* stage, uint32_t stage_bytes, uint64_t* bar) {
  if (impl::is_proxy_peer(comm, peer)) {  // the copy engine cannot reach another node: proxy path
    const Status s = put<Group::kBlock>(comm, dst, src, bytes, peer);
    __syncthreads();
    return s;
  }
  const uint32_t chunk = stage_bytes / kBulkStages / 16 * 16;
  const bool aligned = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) & 15u) == 0 &&
                       (reinterpret_cast<uintptr_t>(stage) & 15u) == 0 && chunk >= 16;
  if (!TANDEM_HAS_BULK_COPY || !aligned) {  // the engine needs 16-byte granules: fall back to load/store
    const Status s = put<Group::kBlock>(comm, dst, src, bytes, peer);
    __syncthreads();
    return s;
  }
  Status status = Status::kOk;
  char* remote = bytes == 0 ? nullptr : impl::checked_peer_ptr(comm, dst, bytes, peer, DeviceOp::kPut, &status);
  if (remote != nullptr && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    const char* s = static_cast<const char*>(src);
    char* buf = static_cast<char*>(stage);
    const size_t nchunks = (bytes + chunk - 1) / chunk;
    auto len = [&](size_t c) { return static_cast<uint32_t>(c + 1 < nchunks ? chunk : bytes - c * chunk); };
    for (int b = 0; b < kBulkStages; ++b) impl::mbar_init(&bar[b], 1);
    impl::mbar_init_fence();
    for (size_t c = 0; c < nchunks && c < static_cast<size_t>(kBulkStages); ++c) {
      impl::mbar_expect_tx(&bar[c], len(c));
      impl::bulk_load(buf + c * chunk, s + c * chunk, len(c), &bar[c]);
    }
    for (size_t c = 0; c < nchunks; ++c) {
      const int b = static_cast<int>(c % kBulkStages);
      while (!impl::mbar_try_wait(&bar[b], static_cast<uint32_t>((c / kBulkStages) & 1u))) {
      }
      impl::bulk_store(remote + c * chunk, buf + b * chunk, len(c));
      impl::bulk_commit();
      // Refill the buffer of the previous chunk once its store has finished reading shared memory; the store
      // just issued may still be in flight.
      const size_t refill = c - 1 + kBulkStages;
      if (c >= 1 && refill < nchunks) {
        impl::bulk_wait_read<1>();
        const int pb = static_cast<int>((c - 1) % kBulkStages);
        impl::mbar_expect_tx(&bar[pb], len(refill));
        impl::bulk_load(buf + pb * chunk, s + refill * chunk, len(refill), &bar[pb]);
      }
    }
    impl::bulk_wait_all();
    for (int b = 0; b < kBulkStages; ++b) impl::mbar_inval(&bar[b]);
  }
  __syncthreads();
  return status;
}

__device__ inline Status put_signal_bulk_block(const DeviceComm& comm, void* dst, const void* src, size_t bytes,
                                               uint64_t* sig, uint64_t value, SignalOp op, int peer,
                                               void* stage, uint32_t stage_bytes, uint64_t* bar) {
  Status status = put_bulk_block(comm, dst, src, bytes, peer, stage, stage_bytes, bar);
  if (status == Status::kOk && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    status = signal(comm, sig, value, op, peer);
  }
  return status;
}

}  // namespace tandem::device

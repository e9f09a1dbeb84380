// tandem device API — barrier (implementation).
//
// Pairwise monotonic counters: for each member p, thread (i mod blockDim) bumps sent[p] (private to this rank),
// stores the new count into recv[my_rank] on p (release), then waits until recv[p] here reaches sent[p]
// (acquire). No reset phase, no sense reversal, no shared epoch to go stale.
#pragma once

#include "tandem/device/barrier.cuh"
#include "tandem/device/impl/addressing.cuh"
#include "tandem/device/impl/proxy_impl.cuh"
#include "tandem/device/impl/ptx.cuh"
#include "tandem/device/wait.cuh"

namespace tandem::device {

__device__ inline Status barrier_block(const DeviceComm& comm, const Team& team) {
  using tandem::ReservedLayout;
  auto* recv = reinterpret_cast<uint64_t*>(comm.heap_base + ReservedLayout::barrier_recv_offset());
  auto* sent = reinterpret_cast<uint64_t*>(comm.heap_base + ReservedLayout::barrier_sent_offset(comm.world));
  const int tid = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int nthr = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  Status st = Status::kOk;

  __syncthreads();  // the block's earlier writes are ordered before the releases below
  for (int i = tid; i < team.size; i += nthr) {
    const int p = team.member(i);
    if (p == comm.rank) continue;
    const uint64_t n = sent[p] + 1;
    sent[p] = n;
    if (impl::is_proxy_peer(comm, p)) {  // another node: the proxy stores the count (after our earlier puts)
      const Status s = impl::proxy_enqueue(comm, proxy::CommandOp::kSignal, p, nullptr, nullptr, 0,
                                           recv + comm.rank, n, 0);
      if (s != Status::kOk) st = s;
      continue;
    }
    auto* remote = reinterpret_cast<uint64_t*>(
        impl::checked_peer_ptr(comm, recv + comm.rank, sizeof(uint64_t), p, DeviceOp::kBarrier, &st));
    if (remote == nullptr) continue;
    impl::release_store(remote, n, impl::peer_on_same_device(comm, p));
  }
  for (int i = tid; i < team.size && st == Status::kOk; i += nthr) {
    const int p = team.member(i);
    if (p == comm.rank) continue;
    uint64_t observed = 0;
    const Status s = wait_until_timeout(comm, recv + p, Cmp::kGe, sent[p], comm.timeout_ns, &observed, p);
    if (s == Status::kTimeout) {
      impl::report_error(comm, s, DeviceOp::kBarrier, p, sent[p], observed, comm.timeout_ns);
    }
    st = s;
  }
  if (__syncthreads_or(st != Status::kOk)) {
    if (__syncthreads_or(st == Status::kTimeout)) return Status::kTimeout;
    if (__syncthreads_or(st == Status::kUnreachablePeer)) return Status::kUnreachablePeer;
    return Status::kAborted;
  }
  return Status::kOk;
}

__device__ inline Status barrier_block(const DeviceComm& comm) { return barrier_block(comm, world_team(comm)); }

}  // namespace tandem::device

// tandem device API — the proxy path: GPU threads enqueue commands for the CPU proxy (implementation detail).
//
// Protocol (transport/include/tandem/transport/proxy_command.h): take a ticket with one atomicAdd on a
// device-memory counter, wait until the ring has room (the proxy publishes `head` in host-mapped memory),
// write the 64-byte body, then publish it with a release store of seq = ticket + 1 at system scope. That
// release also orders the caller's earlier writes to its own heap (the payload) before the proxy's reads.
#pragma once

#include "tandem/device/impl/addressing.cuh"
#include "tandem/device/impl/errors.cuh"
#include "tandem/device/impl/ptx.cuh"
#include "tandem/device/local.cuh"
#include "tandem/device/types.cuh"

namespace tandem::device::impl {

// (has_proxy(comm) is the public one in local.cuh; the bounds check is addressing.cuh's sym_in_heap.)
using tandem::device::has_proxy;

__device__ inline Status proxy_enqueue(const DeviceComm& comm, proxy::CommandOp op, int peer, const void* src,
                                       const void* dst, size_t bytes, const uint64_t* sig, uint64_t value,
                                       uint32_t signal_op) {
  if (!has_proxy(comm)) {
    report_error(comm, Status::kUnreachablePeer, DeviceOp::kProxy, peer, 0, 0, 0);
    return Status::kUnreachablePeer;
  }
  if ((bytes > 0 && (!sym_in_heap(comm, static_cast<const char*>(src), bytes) ||
                     !sym_in_heap(comm, static_cast<const char*>(dst), bytes))) ||
      (sig != nullptr && !sym_in_heap(comm, reinterpret_cast<const char*>(sig), sizeof(uint64_t)))) {
    // The proxy moves data by heap offset: sources of remote puts must be symmetric too.
    report_error(comm, Status::kInvalidArgument, DeviceOp::kProxy, peer, bytes,
                 static_cast<uint64_t>(reinterpret_cast<uintptr_t>(src)), 0);
    return Status::kInvalidArgument;
  }
  const uint64_t ticket = atomicAdd(comm.proxy_tail, 1ull);
  const uint64_t* head = &comm.proxy_ctl->head;
  uint64_t start = 0;
  for (uint32_t spins = 1; ticket - ld_acquire_sys(head) >= comm.proxy_capacity; ++spins) {
    if (*reinterpret_cast<volatile int32_t*>(&comm.proxy_ctl->error) != 0) {
      report_error(comm, Status::kAborted, DeviceOp::kProxy, peer, ticket, 0, 0);
      return Status::kAborted;
    }
    if (aborted(comm)) return Status::kAborted;
    const uint64_t now = globaltimer_ns();
    if (start == 0) start = now;
    if (comm.timeout_ns != 0 && now - start > comm.timeout_ns) {
      report_error(comm, Status::kTimeout, DeviceOp::kProxy, peer, ticket, ld_acquire_sys(head), now - start);
      return Status::kTimeout;
    }
  }
  proxy::Command* slot = comm.proxy_slots + (ticket & (comm.proxy_capacity - 1));
  volatile proxy::Command* v = slot;
  v->op = static_cast<uint32_t>(op);
  v->peer = peer;
  v->channel = 0;
  v->flags = 0;
  v->signal_op = signal_op;
  v->src_offset = bytes > 0 ? static_cast<uint64_t>(static_cast<const char*>(src) - comm.heap_base) : 0;
  v->dst_offset = bytes > 0 ? static_cast<uint64_t>(static_cast<const char*>(dst) - comm.heap_base) : 0;
  v->bytes = bytes;
  v->sig_offset = sig != nullptr ? static_cast<uint64_t>(reinterpret_cast<const char*>(sig) - comm.heap_base) : 0;
  v->sig_value = value;
  st_release_sys(&slot->seq, ticket + 1);  // publish: header last
  return Status::kOk;
}

// Wait until every command enqueued so far (by any thread of this rank) is complete at its destination.
__device__ inline Status proxy_quiet(const DeviceComm& comm) {
  if (!has_proxy(comm)) return Status::kOk;
  const uint64_t issued = atomicAdd(comm.proxy_tail, 0ull);
  uint64_t start = 0;
  for (uint32_t spins = 1;; ++spins) {
    const uint64_t retired = ld_acquire_sys(&comm.proxy_ctl->retired);
    if (retired >= issued) return Status::kOk;
    if (*reinterpret_cast<volatile int32_t*>(&comm.proxy_ctl->error) != 0) {
      report_error(comm, Status::kAborted, DeviceOp::kQuiet, -1, issued, retired, 0);
      return Status::kAborted;
    }
    if (aborted(comm)) return Status::kAborted;
    const uint64_t now = globaltimer_ns();
    if (start == 0) start = now;
    if (comm.timeout_ns != 0 && now - start > comm.timeout_ns) {
      report_error(comm, Status::kTimeout, DeviceOp::kQuiet, -1, issued, retired, now - start);
      return Status::kTimeout;
    }
  }
}

}  // namespace tandem::device::impl

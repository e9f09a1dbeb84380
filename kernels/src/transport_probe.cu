#include "tandem/device.cuh"
#include "tandem/kernels/transport_probe.h"

namespace tandem::kernels::probe {

namespace {

using namespace tandem::device;
namespace device = tandem::device;

__device__ __forceinline__ void record(int32_t* status_out, Status s) {
  if (status_out != nullptr && s != Status::kOk) atomicCAS(reinterpret_cast<int*>(status_out), 0, static_cast<int>(s));
}

__device__ __forceinline__ uint32_t pattern(uint64_t round, size_t word) {
  uint32_t h = static_cast<uint32_t>(round) * 2654435761u ^ static_cast<uint32_t>(round >> 32) * 0x85EBCA6Bu;
  return h ^ (static_cast<uint32_t>(word) * 0x9E3779B1u) ^ static_cast<uint32_t>(word >> 32);
}

template <Group G>
__global__ void put_group_kernel(DeviceComm comm, char* dst, const char* src, size_t bytes, int peer,
                                 uint64_t* sig, int32_t* status_out) {
  Status s = sig != nullptr ? device::put_signal<G>(comm, dst, src, bytes, sig, 1, SignalOp::kAdd, peer)
                            : device::put<G>(comm, dst, src, bytes, peer);
  record(status_out, s);
}

__device__ __forceinline__ void block_range(size_t bytes, size_t* begin, size_t* len) {
  const size_t chunk = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
  const size_t b = static_cast<size_t>(blockIdx.x) * chunk;
  *begin = b < bytes ? b : bytes;
  *len = b < bytes ? (bytes - b < chunk ? bytes - b : chunk) : 0;
}

__global__ void put_block_kernel(DeviceComm comm, char* dst, const char* src, size_t bytes, int peer, uint64_t* sig,
                                 int32_t* status_out) {
  size_t begin, len;
  block_range(bytes, &begin, &len);
  Status s = sig != nullptr ? device::put_signal<Group::kBlock>(comm, dst + begin, src + begin, len, sig, 1, SignalOp::kAdd, peer)
                            : device::put<Group::kBlock>(comm, dst + begin, src + begin, len, peer);
  record(status_out, s);
}

__global__ void put_bulk_kernel(DeviceComm comm, char* dst, const char* src, size_t bytes, int peer, uint64_t* sig,
                                uint32_t stage_bytes, int32_t* status_out) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t bars[kBulkStages];
  size_t begin, len;
  block_range(bytes, &begin, &len);
  Status s = sig != nullptr ? device::put_signal_bulk_block(comm, dst + begin, src + begin, len, sig, 1, SignalOp::kAdd, peer,
                                                    smem, stage_bytes, bars)
                            : device::put_bulk_block(comm, dst + begin, src + begin, len, peer, smem, stage_bytes, bars);
  record(status_out, s);
}

// Flag round trip variants. 0: the public API (signal + wait_until naming the peer, so .gpu scope for a peer
// on this GPU). 8: the API with Order::kRelaxed on both sides (notification flags). 3: the API with the
// waited peer unnamed (-1: .sys scope). 7: the API's wait, with the signal
// as a release store to a peer address resolved once before the loop (isolates the address lookup).
// References on a pointer resolved once: 4 st.release.gpu + spin on ld.acquire.gpu; 5 st.release.gpu +
// relaxed .gpu spin + fence.acq_rel.gpu; 6 relaxed .gpu store and spin + one fence.acq_rel.gpu per side (in a
// ping-pong that fence also releases the next store); 1 the same with volatile accesses and fence.acq_rel.sys;
// 2 volatile store and spin with no ordering at all: not a synchronization primitive, only the hardware's flag
// latency floor, measured so that the cost of the ordering in the others is known. 9 / 10: relaxed store and
// relaxed spin at .gpu / .sys scope on a pointer resolved once, no fence (what Order::kRelaxed costs without
// the API around it, per scope). 11: the API with Order::kRelaxed and the waited peer unnamed (.sys spin).
// 12 / 13: signal through a SignalTarget resolved once (signal_target), relaxed / ordered, with the API wait.
__global__ void pingpong_kernel(DeviceComm comm, uint64_t* flag, int peer, int iters, uint64_t base, bool initiator,
                                int variant, int32_t* status_out) {
  // the reference variants use the device API's scoped word accesses (tandem/device/scoped.cuh) by name
  uint64_t* remote = reinterpret_cast<uint64_t*>(device::peer_ptr(comm, flag, peer));
  volatile uint64_t* vremote = remote;
  const volatile uint64_t* vlocal = flag;
  if (variant != 0 && variant != 3 && variant != 8 && variant < 11 && remote == nullptr) {
    record(status_out, Status::kUnreachablePeer);
    return;
  }
  const bool same_device = device::peer_on_same_device(comm, peer);
  const device::SignalTarget target = device::signal_target(comm, flag, peer);
  for (int i = 1; i <= iters; ++i) {
    const uint64_t v = base + static_cast<uint64_t>(i);
    Status s = Status::kOk;
    if (variant == 0 || variant == 3 || variant == 7 || variant == 8 || variant >= 11) {
      const int waited_peer = variant == 3 || variant == 11 ? -1 : peer;
      const device::Order order =
          variant == 8 || variant == 11 || variant == 12 ? device::Order::kRelaxed : device::Order::kOrdered;
      auto send = [&] {
        if (variant == 7) {  // the API's release store, at the scope that covers the peer
          if (same_device) device::st_release_gpu(remote, v);
          else device::st_release_sys(remote, v);
          return Status::kOk;
        }
        if (variant >= 12) return device::signal(comm, target, v, SignalOp::kSet, order);
        return device::signal(comm, flag, v, SignalOp::kSet, peer, order);
      };
      if (initiator) {
        s = send();
        if (s == Status::kOk) s = device::wait_until(comm, flag, Cmp::kGe, v, waited_peer, order);
      } else {
        s = device::wait_until(comm, flag, Cmp::kGe, v, waited_peer, order);
        if (s == Status::kOk) s = send();
      }
    } else {
      auto store = [&] {
        if (variant == 4 || variant == 5) device::st_release_gpu(remote, v);
        else if (variant == 6 || variant == 9) device::st_relaxed_gpu(remote, v);
        else if (variant == 10) device::st_relaxed_sys(remote, v);
        else *vremote = v;
      };
      if (initiator) store();
      uint32_t spins = 0;
      for (;;) {
        const uint64_t seen = variant == 4    ? device::ld_acquire_gpu(flag)
                              : variant == 10 ? device::ld_relaxed_sys(flag)
                              : variant >= 5  ? device::ld_relaxed_gpu(flag)
                                              : *vlocal;
        if (seen >= v) break;
        if (++spins == (1u << 26)) {
          record(status_out, Status::kTimeout);
          return;
        }
      }
      if (variant == 1) device::fence_acq_rel_sys();
      if (variant == 5 || variant == 6) device::fence_acq_rel_gpu();
      if (!initiator) store();
    }
    if (s != Status::kOk) {
      record(status_out, s);
      return;
    }
  }
}

__global__ void put_signal_stream_kernel(DeviceComm comm, uint32_t* buf, uint32_t* scratch, size_t bytes,
                                         uint64_t* flag, uint64_t* ack, int peer, int iters, uint64_t base,
                                         bool sender, unsigned long long* errors_out, int32_t* status_out) {
  const size_t words = bytes / 4;
  __shared__ unsigned long long block_errors;
  if (threadIdx.x == 0) block_errors = 0;
  for (int i = 1; i <= iters; ++i) {
    const uint64_t round = base + static_cast<uint64_t>(i);
    Status s = Status::kOk;
    if (sender) {
      if (threadIdx.x == 0) s = device::wait_until(comm, ack, Cmp::kGe, round - 1, peer);
      if (__syncthreads_or(s != Status::kOk)) break;
      for (size_t w = threadIdx.x; w < words; w += blockDim.x) scratch[w] = pattern(round, w);
      __syncthreads();
      s = device::put_signal<Group::kBlock>(comm, buf, scratch, bytes, flag, round, SignalOp::kSet, peer);
      if (__syncthreads_or(s != Status::kOk)) break;
    } else {
      uint64_t seen = 0;
      if (threadIdx.x == 0) {
        s = device::wait_until(comm, flag, Cmp::kGe, round, peer);
        seen = *reinterpret_cast<volatile uint64_t*>(flag);
        if (s == Status::kOk && seen != round) atomicAdd(&block_errors, 1ull);  // the sender ran ahead
      }
      if (__syncthreads_or(s != Status::kOk)) break;
      unsigned long long wrong = 0;
      for (size_t w = threadIdx.x; w < words; w += blockDim.x) wrong += buf[w] != pattern(round, w);
      if (wrong) atomicAdd(&block_errors, wrong);
      __syncthreads();
      if (threadIdx.x == 0) s = device::signal(comm, ack, round, SignalOp::kSet, peer);
      if (__syncthreads_or(s != Status::kOk)) break;
    }
    record(status_out, s);
  }
  __syncthreads();
  if (threadIdx.x == 0 && errors_out != nullptr) atomicAdd(errors_out, block_errors);
}

__global__ void barrier_loop_kernel(DeviceComm comm, uint64_t* slots, int iters, uint64_t base, device::Team team,
                                    unsigned long long* errors_out, int32_t* status_out, long long* progress_out) {
  __shared__ unsigned long long block_errors;
  if (threadIdx.x == 0) block_errors = 0;
  __syncthreads();
  for (int i = 1; i <= iters; ++i) {
    const uint64_t epoch = base + static_cast<uint64_t>(i);
    Status s = Status::kOk;
    for (int m = threadIdx.x; m < team.size; m += blockDim.x) {
      const Status sp = device::signal(comm, slots + comm.rank, epoch, SignalOp::kSet, team.member(m));
      if (sp != Status::kOk) s = sp;
    }
    if (__syncthreads_or(s != Status::kOk)) {
      record(status_out, s);
      break;
    }
    s = device::barrier_block(comm, team);
    if (s != Status::kOk) {
      record(status_out, s);
      break;
    }
    for (int m = threadIdx.x; m < team.size; m += blockDim.x) {
      const uint64_t v = *reinterpret_cast<volatile uint64_t*>(slots + team.member(m));
      if (v != epoch) atomicAdd(&block_errors, 1ull);
    }
    s = device::barrier_block(comm, team);
    if (s != Status::kOk) {
      record(status_out, s);
      break;
    }
    if (threadIdx.x == 0 && progress_out != nullptr) *reinterpret_cast<volatile long long*>(progress_out) = i;
  }
  __syncthreads();
  if (threadIdx.x == 0 && errors_out != nullptr) atomicAdd(errors_out, block_errors);
}

__global__ void wait_kernel(DeviceComm comm, const uint64_t* flag, Cmp cmp, uint64_t value, int peer,
                            uint64_t timeout_ns, bool bounded_form, int32_t* status_out, uint64_t* observed_out) {
  uint64_t observed = 0;
  Status s;
  if (bounded_form) {
    s = device::wait_until(comm, flag, cmp, value, peer);
    observed = *reinterpret_cast<const volatile uint64_t*>(flag);
  } else {
    s = device::wait_until_timeout(comm, flag, cmp, value, timeout_ns, &observed);
  }
  if (status_out != nullptr) *status_out = static_cast<int32_t>(s);
  if (observed_out != nullptr) *observed_out = observed;
}

__global__ void quiet_kernel(DeviceComm comm, int32_t* status_out) { record(status_out, device::quiet(comm)); }

__global__ void signal_kernel(DeviceComm comm, uint64_t* flag, uint64_t value, SignalOp op, int peer,
                              int32_t* status_out) {
  record(status_out, device::signal(comm, flag, value, op, peer));
}

Status launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status::kOk : Status::kCudaError;
}

constexpr uint32_t kBulkStageBytes = 128u * 1024u;  // 4 stages of 32 KiB in flight per block

}  // namespace

int put_blocks(PutMode mode, size_t bytes, int blocks, int sm_count) {
  if (mode == PutMode::kThread || mode == PutMode::kWarp) return 1;
  if (blocks <= 0) blocks = sm_count;
  // No block gets less than 16 KiB (a block's fixed cost dominates below that).
  const size_t useful = (bytes + (16u << 10) - 1) / (16u << 10);
  return static_cast<int>(useful < static_cast<size_t>(blocks) ? (useful == 0 ? 1 : useful) : blocks);
}

Status put(const DeviceComm& comm, PutMode mode, void* dst, const void* src, size_t bytes, int peer, int blocks,
           int threads, uint64_t* sig, int32_t* status_out, cudaStream_t stream) {
  if (blocks <= 0 || threads <= 0 || threads > 1024 || threads % 32 != 0) return Status::kInvalidArgument;
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  switch (mode) {
    case PutMode::kThread:
      put_group_kernel<Group::kThread><<<1, 1, 0, stream>>>(comm, d, s, bytes, peer, sig, status_out);
      break;
    case PutMode::kWarp:
      put_group_kernel<Group::kWarp><<<1, 32, 0, stream>>>(comm, d, s, bytes, peer, sig, status_out);
      break;
    case PutMode::kBlock:
      put_block_kernel<<<blocks, threads, 0, stream>>>(comm, d, s, bytes, peer, sig, status_out);
      break;
    case PutMode::kBulk: {
      static bool configured = false;
      if (!configured) {
        if (cudaFuncSetAttribute(put_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBulkStageBytes) !=
            cudaSuccess)
          return Status::kCudaError;
        configured = true;
      }
      put_bulk_kernel<<<blocks, threads, kBulkStageBytes, stream>>>(comm, d, s, bytes, peer, sig, kBulkStageBytes,
                                                                   status_out);
      break;
    }
    default:
      return Status::kInvalidArgument;
  }
  return launched();
}

Status pingpong(const DeviceComm& comm, uint64_t* flag, int peer, int iters, uint64_t base, bool initiator,
                int variant, int32_t* status_out, cudaStream_t stream) {
  if (iters < 0 || variant < 0 || variant > 13) return Status::kInvalidArgument;
  pingpong_kernel<<<1, 1, 0, stream>>>(comm, flag, peer, iters, base, initiator, variant, status_out);
  return launched();
}

Status put_signal_stream(const DeviceComm& comm, void* buf, void* scratch, size_t bytes, uint64_t* flag,
                         uint64_t* ack, int peer, int iters, uint64_t base, bool sender, int threads,
                         unsigned long long* errors_out, int32_t* status_out, cudaStream_t stream) {
  if (bytes % 4 != 0 || threads <= 0 || threads > 1024 || iters < 0) return Status::kInvalidArgument;
  put_signal_stream_kernel<<<1, threads, 0, stream>>>(comm, static_cast<uint32_t*>(buf),
                                                      static_cast<uint32_t*>(scratch), bytes, flag, ack, peer, iters,
                                                      base, sender, errors_out, status_out);
  return launched();
}

Status barrier_loop(const DeviceComm& comm, uint64_t* slots, int iters, uint64_t base, int team_start,
                    int team_stride, int team_size, unsigned long long* errors_out, int32_t* status_out,
                    long long* progress_out, cudaStream_t stream) {
  if (iters < 0) return Status::kInvalidArgument;
  device::Team team{team_start, team_stride, team_size <= 0 ? comm.world : team_size};
  if (team.start < 0 || team.stride <= 0 || team.member(team.size - 1) >= comm.world) return Status::kInvalidArgument;
  barrier_loop_kernel<<<1, 128, 0, stream>>>(comm, slots, iters, base, team, errors_out, status_out, progress_out);
  return launched();
}

Status wait(const DeviceComm& comm, const uint64_t* flag, int cmp, uint64_t value, int peer, uint64_t timeout_ns,
            bool bounded_form, int32_t* status_out, uint64_t* observed_out, cudaStream_t stream) {
  if (cmp < 0 || cmp > static_cast<int>(Cmp::kLt)) return Status::kInvalidArgument;
  wait_kernel<<<1, 1, 0, stream>>>(comm, flag, static_cast<Cmp>(cmp), value, peer, timeout_ns, bounded_form,
                                   status_out, observed_out);
  return launched();
}

Status quiet(const DeviceComm& comm, int32_t* status_out, cudaStream_t stream) {
  quiet_kernel<<<1, 1, 0, stream>>>(comm, status_out);
  return launched();
}

Status signal(const DeviceComm& comm, uint64_t* flag, uint64_t value, int op, int peer, int32_t* status_out,
              cudaStream_t stream) {
  if (op != 0 && op != 1) return Status::kInvalidArgument;
  signal_kernel<<<1, 1, 0, stream>>>(comm, flag, value, static_cast<SignalOp>(op), peer, status_out);
  return launched();
}

}  // namespace tandem::kernels::probe

// tandem kernels — stream-ordered flags between ranks: one-block kernels that signal peers and wait for them,
// for pipelines whose data moves by copy engine (cudaMemcpyAsync through peer mappings) and whose compute is
// any library's kernels (cuBLAS). The TP ops' "pipelined" mode is built on them (python/tandem/ops/tp.py).
//
// Epochs. Each pipeline keeps a counter in this rank's memory (its workspace): advance() adds one per call, and
// every signal writes, and every wait compares against, the counter's value read on the device when the kernel
// runs -- so a captured CUDA graph signals and waits for a fresh epoch on every replay, and flags never need a
// reset (they only grow). Ranks call the pipeline the same number of times, so their counters agree.
//
// Ordering. signal() runs after everything earlier on its stream has completed (stream order), copies by the
// copy engine included, and releases at system scope (gpu scope for a peer on this GPU): a peer whose wait()
// returned sees every byte those copies wrote, and so does every kernel the peer enqueued after its wait(). A
// flag has one writer: the rank that signals it (name it as `peer` in wait(), which picks the scope).
//
// Bounds. wait() is bounded by the communicator's timeout; on timeout (or abort) it records the error (rank,
// op wait_until, the peer, expected and observed value) and returns, so the stream moves on and the error is
// raised by the host's next check(). It never waits forever.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "tandem/transport/device_comm.h"

namespace tandem::kernels::stream_sync {

// *counter += 1 (this rank's memory).
Status advance(uint64_t* counter, cudaStream_t stream, std::string* why = nullptr);

// For each peer i in peers[0, count): the flag at symmetric address `flag` on that peer := *counter + offset.
// `peers` is a host array (copied into the launch). Every peer must have a load/store path (one node).
Status signal(const DeviceComm& comm, uint64_t* flag, const int* peers, int count, const uint64_t* counter,
              int64_t offset, cudaStream_t stream, std::string* why = nullptr);

// For each i in [0, count): wait until flags[i] (this rank's memory) >= *counter + offset, bounded; writers[i]
// names the rank that signals flags[i]. `flags` and `writers` are host arrays copied into the launch.
Status wait(const DeviceComm& comm, uint64_t* const* flags, const int* writers, int count, const uint64_t* counter,
            int64_t offset, cudaStream_t stream, std::string* why = nullptr);

// cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream) on raw addresses: a peer's heap mapped here is
// written through the mapping (the copy engines), with no framework deciding where the bytes "belong".
Status copy(void* dst, const void* src, size_t bytes, cudaStream_t stream, std::string* why = nullptr);

// The same copy by a grid-stride kernel of `blocks` blocks on the stream (SMs instead of copy engines): a
// diagnostic alternative (TANDEM_PIPELINE_COPY=sm) that takes the copy engines out of the path.
Status copy_on_sms(void* dst, const void* src, size_t bytes, int blocks, cudaStream_t stream,
                   std::string* why = nullptr);

// Load this file's kernels now (lazy module loading would load them at their first launch, possibly while a
// wait of the same pipeline spins).
cudaError_t preload_kernels();

constexpr int kMaxFlags = 64;  // peers a signal() or flags a wait() takes at once (the world size bound)

}  // namespace tandem::kernels::stream_sync

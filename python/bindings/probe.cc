#include <cuda_runtime_api.h>

#include "common.h"
#include "tandem/kernels/transport_probe.h"
#include "tandem/transport/comm.h"

namespace tandem_py {

namespace {

template <class T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}
cudaStream_t stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

void bind_probe(py::module_& m) {
  namespace probe = tandem::kernels::probe;
  py::module_ p = m.def_submodule("probe", "Transport probe kernels (tests and benchmarks of the primitives).");
  using Comm = tandem::Communicator;
  p.def(
      "put",
      [](const Comm& c, int mode, uintptr_t dst, uintptr_t src, size_t bytes, int peer, int blocks, int threads,
         uintptr_t sig, uintptr_t status, uintptr_t s) {
        const int nb = probe::put_blocks(static_cast<probe::PutMode>(mode), bytes, blocks, c.sm_count());
        check_launch(probe::put(c.device_comm(), static_cast<probe::PutMode>(mode), ptr<void>(dst),
                                ptr<const void>(src), bytes, peer, nb, threads, ptr<uint64_t>(sig),
                                ptr<int32_t>(status), stream(s)),
                     "probe.put", c.rank());
        return nb;
      },
      py::arg("comm"), py::arg("mode"), py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("peer"),
      py::arg("blocks"), py::arg("threads"), py::arg("sig"), py::arg("status"), py::arg("stream"),
      "Launch a put; returns the number of blocks used (each adds 1 to `sig` when set).");
  p.def(
      "pingpong",
      [](const Comm& c, uintptr_t flag, int peer, int iters, uint64_t base, bool initiator, int variant,
         uintptr_t status, uintptr_t s) {
        check_launch(probe::pingpong(c.device_comm(), ptr<uint64_t>(flag), peer, iters, base, initiator, variant,
                                     ptr<int32_t>(status), stream(s)),
                     "probe.pingpong", c.rank());
      },
      py::arg("comm"), py::arg("flag"), py::arg("peer"), py::arg("iters"), py::arg("base"), py::arg("initiator"),
      py::arg("variant"), py::arg("status"), py::arg("stream"));
  p.def(
      "put_signal_stream",
      [](const Comm& c, uintptr_t buf, uintptr_t scratch, size_t bytes, uintptr_t flag, uintptr_t ack, int peer,
         int iters, uint64_t base, bool sender, int threads, uintptr_t errors, uintptr_t status, uintptr_t s) {
        check_launch(probe::put_signal_stream(c.device_comm(), ptr<void>(buf), ptr<void>(scratch), bytes,
                                              ptr<uint64_t>(flag), ptr<uint64_t>(ack), peer, iters, base, sender,
                                              threads, ptr<unsigned long long>(errors), ptr<int32_t>(status),
                                              stream(s)),
                     "probe.put_signal_stream", c.rank());
      },
      py::arg("comm"), py::arg("buf"), py::arg("scratch"), py::arg("bytes"), py::arg("flag"), py::arg("ack"),
      py::arg("peer"), py::arg("iters"), py::arg("base"), py::arg("sender"), py::arg("threads"), py::arg("errors"),
      py::arg("status"), py::arg("stream"));
  p.def(
      "barrier_loop",
      [](const Comm& c, uintptr_t slots, int iters, uint64_t base, int team_start, int team_stride, int team_size,
         uintptr_t errors, uintptr_t status, uintptr_t progress, uintptr_t s) {
        check_launch(probe::barrier_loop(c.device_comm(), ptr<uint64_t>(slots), iters, base, team_start,
                                         team_stride, team_size, ptr<unsigned long long>(errors),
                                         ptr<int32_t>(status), ptr<long long>(progress), stream(s)),
                     "probe.barrier_loop", c.rank());
      },
      py::arg("comm"), py::arg("slots"), py::arg("iters"), py::arg("base"), py::arg("team_start"),
      py::arg("team_stride"), py::arg("team_size"), py::arg("errors"), py::arg("status"), py::arg("progress"),
      py::arg("stream"));
  p.def(
      "wait",
      [](const Comm& c, uintptr_t flag, int cmp, uint64_t value, int peer, uint64_t timeout_ns, bool bounded_form,
         uintptr_t status, uintptr_t observed, uintptr_t s) {
        check_launch(probe::wait(c.device_comm(), ptr<const uint64_t>(flag), cmp, value, peer, timeout_ns,
                                 bounded_form, ptr<int32_t>(status), ptr<uint64_t>(observed), stream(s)),
                     "probe.wait", c.rank());
      },
      py::arg("comm"), py::arg("flag"), py::arg("cmp"), py::arg("value"), py::arg("peer"), py::arg("timeout_ns"),
      py::arg("bounded_form"), py::arg("status"), py::arg("observed"), py::arg("stream"));
  p.def(
      "signal",
      [](const Comm& c, uintptr_t flag, uint64_t value, int op, int peer, uintptr_t status, uintptr_t s) {
        check_launch(probe::signal(c.device_comm(), ptr<uint64_t>(flag), value, op, peer, ptr<int32_t>(status),
                                   stream(s)),
                     "probe.signal", c.rank());
      },
      py::arg("comm"), py::arg("flag"), py::arg("value"), py::arg("op"), py::arg("peer"), py::arg("status"),
      py::arg("stream"));
  p.def(
      "quiet",
      [](const Comm& c, uintptr_t status, uintptr_t s) {
        check_launch(probe::quiet(c.device_comm(), ptr<int32_t>(status), stream(s)), "probe.quiet", c.rank());
      },
      py::arg("comm"), py::arg("status"), py::arg("stream"));
  p.def(
      "memcpy_d2d",
      [](uintptr_t dst, uintptr_t src, size_t bytes, uintptr_t s) {
        const cudaError_t e = cudaMemcpyAsync(ptr<void>(dst), ptr<const void>(src), bytes, cudaMemcpyDeviceToDevice,
                                              stream(s));
        if (e != cudaSuccess) tandem::throw_cuda_error(e, "cudaMemcpyAsync", "probe.memcpy_d2d", -1);
      },
      py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("stream"),
      "cudaMemcpyAsync device-to-device: the baseline of the put benchmark.");
}

}  // namespace tandem_py

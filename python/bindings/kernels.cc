// Bindings of the kernels layer (raw pointers + stream; validation happens in tandem.ops before launch).
#include <cuda_runtime_api.h>

#include "common.h"
#include "tandem/kernels/gemm/gemm.h"
#include "tandem/transport/comm.h"

namespace tandem_py {

void bind_kernels(py::module_& m) {
  namespace g = tandem::kernels::gemm;
  py::module_ k = m.def_submodule("kernels", "tandem kernels (host adapters)");
  auto args = [](int m_, int n, int k_, int dtype, uintptr_t a, int64_t lda, uintptr_t b, int64_t ldb, uintptr_t d,
                 int64_t ldd, float alpha, int sm_count) {
    g::GemmArgs x;
    x.m = m_;
    x.n = n;
    x.k = k_;
    x.dtype = static_cast<g::DType>(dtype);
    x.a = reinterpret_cast<const void*>(a);
    x.lda = lda;
    x.b = reinterpret_cast<const void*>(b);
    x.ldb = ldb;
    x.d = reinterpret_cast<void*>(d);
    x.ldd = ldd;
    x.alpha = alpha;
    x.sm_count = sm_count;
    return x;
  };
  k.def(
      "gemm_can_implement",
      [args](int m_, int n, int k_, int dtype, uintptr_t a, int64_t lda, uintptr_t b, int64_t ldb, uintptr_t d,
             int64_t ldd) {
        std::string why;
        const auto s = g::can_implement(args(m_, n, k_, dtype, a, lda, b, ldb, d, ldd, 1.0f, 0), &why);
        return s == tandem::Status::kOk ? std::string() : why;
      },
      "'' if the GEMM core can run this problem, else the reason.");
  k.def("gemm_workspace_size",
        [args](int m_, int n, int k_, int dtype) {
          return g::workspace_size(args(m_, n, k_, dtype, 16, k_, 16, n, 16, n, 1.0f, 0));
        });
  k.def(
      "gemm",
      [args](int m_, int n, int k_, int dtype, uintptr_t a, int64_t lda, uintptr_t b, int64_t ldb, uintptr_t d,
             int64_t ldd, float alpha, int sm_count, uintptr_t workspace, uintptr_t stream) {
        std::string why;
        const auto s = g::run(args(m_, n, k_, dtype, a, lda, b, ldb, d, ldd, alpha, sm_count),
                              reinterpret_cast<void*>(workspace), reinterpret_cast<cudaStream_t>(stream), &why);
        return s == tandem::Status::kOk ? std::string() : (why.empty() ? std::string("failed") : why);
      },
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype"), py::arg("a"), py::arg("lda"), py::arg("b"),
      py::arg("ldb"), py::arg("d"), py::arg("ldd"), py::arg("alpha"), py::arg("sm_count"), py::arg("workspace"),
      py::arg("stream"), "Launch; returns '' or the reason it did not run.");
  k.def(
      "gemm_with_arrivals",
      [args](const tandem::Communicator& c, int m_, int n, int k_, int dtype, uintptr_t a, int64_t lda, uintptr_t b,
             int64_t ldb, uintptr_t d, int64_t ldd, uintptr_t flags, uint64_t epoch, int chunk_rows, int chunks,
             int first_chunk, int source_of_chunk0, uintptr_t workspace, uintptr_t stream) {
        g::ArrivalSchedule s;
        s.comm = c.device_comm();
        s.flags = reinterpret_cast<const uint64_t*>(flags);
        s.epoch = epoch;
        s.chunk_rows = chunk_rows;
        s.chunks = chunks;
        s.first_chunk = first_chunk;
        s.source_of_chunk0 = source_of_chunk0;
        std::string why;
        const auto st = g::run_with_arrivals(args(m_, n, k_, dtype, a, lda, b, ldb, d, ldd, 1.0f, c.sm_count()), s,
                                             reinterpret_cast<void*>(workspace),
                                             reinterpret_cast<cudaStream_t>(stream), &why);
        return st == tandem::Status::kOk ? std::string() : (why.empty() ? std::string("failed") : why);
      },
      "The GEMM core with the arrival-aware tile scheduler (the AG+GEMM mainloop's contract); returns '' or why "
      "it did not run. Timed-out waits are recorded in the communicator.");
}

}  // namespace tandem_py

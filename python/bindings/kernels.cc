// Bindings of the kernels layer, typed: each op's Args struct is bound once as a Python class with the C++
// adapter's own fields (device addresses as ints, the nested plan and shape structs as objects), one Mode enum says
// what to launch, and a launch that does not run throws tandem::Error, which reaches Python as the TandemError of
// its real status (module.cc's translator). can_implement answers '' or the reason: it is a question, not a
// failure. Validation has one place per layer: tandem.ops checks the user's tensors and names the argument; the
// C++ adapter's can_implement is the last guard before a launch.
#include <cuda_runtime_api.h>

#include <type_traits>

#include <pybind11/stl.h>

#include "common.h"
#include "tandem/kernels/attention/ring_attention.h"
#include "tandem/kernels/attention/ring_schedule.h"
#include "tandem/kernels/fused/tp_gemm.h"
#include "tandem/kernels/gemm/gemm.h"
#include "tandem/kernels/gemm/gemm_variants.h"
#include "tandem/kernels/gemm/launch_table.h"
#include "tandem/kernels/gemm/scaled_gemm.h"
#include "tandem/kernels/moe/moe.h"
#include "tandem/kernels/stream_sync.h"
#include "tandem/transport/comm.h"

namespace tandem_py {

namespace {

namespace g = tandem::kernels::gemm;
namespace tp = tandem::kernels::tp;
namespace moe = tandem::kernels::moe;
namespace attn = tandem::kernels::attention;
namespace ss = tandem::kernels::stream_sync;
using tandem::Status;

// What a launch runs. Not every op takes every mode: an op given one it does not take throws INVALID_ARGUMENT.
enum class Mode {
  kFused,    // the op's persistent kernel (SM roles): TP fused, MoE fused dispatch + GEMM, combine, ring attention
  kUnfused,  // the op's kernels one after another (TP: tandem's GEMM then the collective; MoE: dispatch then GEMM)
  kGather,   // AG+GEMM: the all-gather alone (the caller multiplies the gathered A)
  kWait,     // GEMM+RS/AR: until every peer has read this rank's partial of the previous launch
  kReduce,   // GEMM+RS/AR: the reduction (and AR's gather) alone, over the workspace's partial buffer
  kDispatch, // MoE: the dispatch alone, its received rows copied into args.rows (no GEMM; w and y unused)
};

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kFused: return "FUSED";
    case Mode::kUnfused: return "UNFUSED";
    case Mode::kGather: return "GATHER";
    case Mode::kWait: return "WAIT";
    case Mode::kReduce: return "REDUCE";
    case Mode::kDispatch: return "DISPATCH";
  }
  return "?";
}

// Throw the adapter's failure as tandem::Error (status kept, the reason as the detail).
void check(Status s, const std::string& why, const char* op, int rank) {
  if (s != Status::kOk) throw tandem::Error(s, op, rank, -1, why.empty() ? std::string("failed") : why);
}

void check_cuda(cudaError_t e, const char* op) {
  if (e != cudaSuccess) throw tandem::Error(Status::kCudaError, op, -1, -1, cudaGetErrorString(e));
}

[[noreturn]] void wrong_mode(Mode m, const char* op, int rank) {
  throw tandem::Error(Status::kInvalidArgument, op, rank, -1, std::string("mode ") + mode_name(m) + " does not apply");
}

std::string reason(Status s, const std::string& why) { return s == Status::kOk ? std::string() : (why.empty() ? "failed" : why); }

// A device address field, as an int in Python.
// _raw(): the Args' bytes as they are in memory, for the C++ dispatcher kernels of the GEMM ops, which keep a
// prepared copy per call signature (launch_table.h; they check the size against the table's).
template <class C>
void def_raw_bytes(py::class_<C>& cls) {
  static_assert(std::is_trivially_copyable_v<C>, "the Args cross as bytes");
  cls.def("_raw", [](const C& x) { return py::bytes(reinterpret_cast<const char*>(&x), sizeof(C)); });
}

template <class C, class T>
void def_address(py::class_<C>& cls, const char* name, T* C::*field) {
  cls.def_property(
      name, [field](const C& c) { return reinterpret_cast<uintptr_t>(c.*field); },
      [field](C& c, uintptr_t p) { c.*field = reinterpret_cast<T*>(p); });
}

// The element type as the ops' integer code (tandem.ops._runtime.DTYPES: 0 bf16, 1 fp16).
template <class C>
void def_dtype(py::class_<C>& cls) {
  cls.def_property(
      "dtype", [](const C& c) { return static_cast<int>(c.dtype); },
      [](C& c, int d) {
        if (d != 0 && d != 1) throw tandem::Error(Status::kInvalidArgument, "dtype", -1, -1, "0 (bf16) or 1 (fp16)");
        c.dtype = static_cast<g::DType>(d);
      });
}

// The communicator's part of an Args: its device state, the SMs when the caller left them 0, and (TP) how the
// ranks group into nodes. Launches go to the communicator's GPU (ScopedDevice in each binding).
template <class A>
A with_comm(const tandem::Communicator& c, A a) {
  a.comm = c.device_comm();
  if (a.plan.sm_count <= 0) a.plan.sm_count = c.sm_count();
  if constexpr (std::is_base_of_v<tp::AgGemmArgs, A> || std::is_base_of_v<tp::GemmRsArgs, A>)
    a.ranks_per_node = c.uniform_ranks_per_node();
  return a;
}

template <class A>
void def_comm_queries(py::module_& k, const char* what) {
  k.def(
      "can_implement",
      [](const tandem::Communicator& c, const A& a) {
        tandem::ScopedDevice device_scope(c.device());
        std::string why;
        const Status s = [&] {
          if constexpr (std::is_same_v<A, moe::DispatchArgs> || std::is_same_v<A, moe::CombineArgs>)
            return moe::can_implement(with_comm(c, a), &why);
          else if constexpr (std::is_same_v<A, attn::RingArgs>)
            return attn::can_implement(with_comm(c, a), &why);
          else
            return tp::can_implement(with_comm(c, a), &why);
        }();
        return reason(s, why);
      },
      py::arg("comm"), py::arg("args"), (std::string("'' if the adapter can run ") + what + ", else the reason").c_str());
  k.def(
      "workspace_size",
      [](const tandem::Communicator& c, const A& a) {
        tandem::ScopedDevice device_scope(c.device());
        if constexpr (std::is_same_v<A, moe::DispatchArgs> || std::is_same_v<A, moe::CombineArgs>)
          return moe::workspace_size(with_comm(c, a));
        else if constexpr (std::is_same_v<A, attn::RingArgs>)
          return attn::workspace_size(with_comm(c, a));
        else
          return tp::workspace_size(with_comm(c, a));
      },
      py::arg("comm"), py::arg("args"),
      (std::string("Bytes of the symmetric workspace of ") + what + " (its shape, dtype, plan and the world)").c_str());
}

template <class A>
py::class_<A> bind_tp_args(py::module_& k, const char* name) {
  py::class_<A> cls(k, name);
  cls.def(py::init<>());
  def_dtype(cls);
  cls.def_readwrite("plan", &A::plan);
  return cls;
}

}  // namespace

void bind_kernels(py::module_& m) {
  py::module_ k = m.def_submodule("kernels", "tandem kernels (host adapters): typed Args, Mode, launches");

  py::enum_<Mode>(k, "Mode", "What a launch runs (not every op takes every mode)")
      .value("FUSED", Mode::kFused)
      .value("UNFUSED", Mode::kUnfused)
      .value("GATHER", Mode::kGather)
      .value("WAIT", Mode::kWait)
      .value("REDUCE", Mode::kReduce)
      .value("DISPATCH", Mode::kDispatch);

  // ---- the GEMM core ----------------------------------------------------------------------------------------------
  py::enum_<g::GemmArgs::Raster>(k, "Raster", "the order the GEMM's persistent scheduler walks output tiles in")
      .value("HEURISTIC", g::GemmArgs::Raster::kHeuristic)
      .value("ALONG_M", g::GemmArgs::Raster::kAlongM)
      .value("ALONG_N", g::GemmArgs::Raster::kAlongN);
  {
    py::class_<g::GemmArgs> cls(k, "GemmArgs", "D = alpha A @ B (+ beta C), gemm.h");
    cls.def(py::init<>());
    def_dtype(cls);
    cls.def_readwrite("m", &g::GemmArgs::m).def_readwrite("n", &g::GemmArgs::n).def_readwrite("k", &g::GemmArgs::k);
    def_address(cls, "a", &g::GemmArgs::a);
    def_address(cls, "b", &g::GemmArgs::b);
    def_address(cls, "d", &g::GemmArgs::d);
    def_address(cls, "c", &g::GemmArgs::c);
    cls.def_readwrite("lda", &g::GemmArgs::lda)
        .def_readwrite("ldb", &g::GemmArgs::ldb)
        .def_readwrite("ldd", &g::GemmArgs::ldd)
        .def_readwrite("ldc", &g::GemmArgs::ldc)
        .def_readwrite("alpha", &g::GemmArgs::alpha)
        .def_readwrite("beta", &g::GemmArgs::beta)
        .def_readwrite("sm_count", &g::GemmArgs::sm_count)
        .def_readwrite("max_swizzle", &g::GemmArgs::max_swizzle)
        .def_readwrite("raster", &g::GemmArgs::raster);
    def_raw_bytes(cls);
  }
  k.def("can_implement", [](const g::GemmArgs& a) {
    std::string why;
    return reason(g::can_implement(a, &why), why);
  }, py::arg("args"));
  k.def("workspace_size", [](const g::GemmArgs& a) { return g::workspace_size(a); }, py::arg("args"),
        "Bytes of the GEMM's (non-symmetric) workspace.");
  k.def(
      "gemm",
      [](const g::GemmArgs& a, uintptr_t workspace, uintptr_t stream) {
        std::string why;
        check(g::run(a, reinterpret_cast<void*>(workspace), reinterpret_cast<cudaStream_t>(stream), &why), why,
              "gemm", -1);
      },
      py::arg("args"), py::arg("workspace"), py::arg("stream"), "Launch the GEMM core; throws if it does not run.");
  // The ops' per-call launches: the prepared Args are copied (taken by value) and this call's addresses set on the
  // copy, so a prepared Args shared by threads that call the same signature is never written (setting the
  // addresses on the shared object, then launching, let one thread launch with another's tensors).
  k.def(
      "gemm_at",
      [](g::GemmArgs x, uintptr_t a, uintptr_t b, uintptr_t d, uintptr_t workspace, uintptr_t stream) {
        x.a = reinterpret_cast<const void*>(a);
        x.b = reinterpret_cast<const void*>(b);
        x.d = reinterpret_cast<void*>(d);
        std::string why;
        check(g::run(x, reinterpret_cast<void*>(workspace), reinterpret_cast<cudaStream_t>(stream), &why), why,
              "gemm", -1);
      },
      py::arg("args"), py::arg("a"), py::arg("b"), py::arg("d"), py::arg("workspace"), py::arg("stream"),
      "Launch the GEMM core on a copy of args with these addresses; throws if it does not run.");
  k.def("preload_gemm_kernels", [] { check_cuda(g::preload_kernels(), "gemm.preload"); });

  // ---- FP8 GEMM with scales (scaled_gemm.h) ----------------------------------------------------------------------
  py::enum_<g::Scaling>(k, "Scaling", "How scaled_gemm's scales apply: one each (TENSOR) or per row of A / column of B")
      .value("TENSOR", g::Scaling::kTensor)
      .value("ROW", g::Scaling::kRow);
  py::enum_<g::ScaledConfig>(k, "ScaledConfig", "The CUTLASS configuration of scaled_gemm (scaled_gemm.h)")
      .value("FP8_COOP_128X128_C2", g::ScaledConfig::kCoop128C2)
      .value("FP8_COOP_128X128_C1", g::ScaledConfig::kCoop128C1)
      .value("FP8_COOP_128X128_C1X2", g::ScaledConfig::kCoop128C1x2)
      .value("FP8_PINGPONG_64X128_C1", g::ScaledConfig::kPingpong64C1)
      .value("FP8_SPLITK2_128X128_C1", g::ScaledConfig::kSplitK2Coop128)
      .value("FP8_STREAMK_128X128_C1", g::ScaledConfig::kStreamKCoop128)
      .value("FP8_COOP_128X192_C2", g::ScaledConfig::kCoop128x192C2)
      .value("FP8_COOP_128X192_C1", g::ScaledConfig::kCoop128x192C1)
      .value("FP8_PINGPONG_64X192_C1", g::ScaledConfig::kPingpong64x192C1);
  {
    py::class_<g::ScaledGemmArgs> cls(k, "ScaledGemmArgs",
                                      "D (bf16) = scale_a * (scale_b * (A @ B)), A e4m3 row-major, B e4m3 column-major");
    cls.def(py::init<>());
    cls.def_readwrite("m", &g::ScaledGemmArgs::m)
        .def_readwrite("n", &g::ScaledGemmArgs::n)
        .def_readwrite("k", &g::ScaledGemmArgs::k);
    def_address(cls, "a", &g::ScaledGemmArgs::a);
    def_address(cls, "b", &g::ScaledGemmArgs::b);
    def_address(cls, "d", &g::ScaledGemmArgs::d);
    def_address(cls, "scale_a", &g::ScaledGemmArgs::scale_a);
    def_address(cls, "scale_b", &g::ScaledGemmArgs::scale_b);
    cls.def_readwrite("lda", &g::ScaledGemmArgs::lda)
        .def_readwrite("ldb", &g::ScaledGemmArgs::ldb)
        .def_readwrite("ldd", &g::ScaledGemmArgs::ldd)
        .def_readwrite("scaling", &g::ScaledGemmArgs::scaling)
        .def_readwrite("sm_count", &g::ScaledGemmArgs::sm_count)
        .def_readwrite("config", &g::ScaledGemmArgs::config)
        .def_readwrite("max_swizzle", &g::ScaledGemmArgs::max_swizzle)
        .def_readwrite("raster", &g::ScaledGemmArgs::raster);
    def_raw_bytes(cls);
  }
  // The launchers for torch.ops.tandem.gemm / scaled_gemm's C++ dispatcher kernels (python/torch_ops/,
  // launch_table.h): a capsule, so that library reaches them without linking the kernels a second time.
  k.def("_gemm_launch_table", [] {
    return py::capsule(const_cast<g::GemmLaunchTable*>(g::gemm_launch_table()), g::kGemmLaunchTableName);
  });
  k.def("can_implement", [](const g::ScaledGemmArgs& a) {
    std::string why;
    return reason(g::can_implement(a, &why), why);
  }, py::arg("args"));
  k.def("workspace_size", [](const g::ScaledGemmArgs& a) { return g::workspace_size(a); }, py::arg("args"),
        "Bytes of the FP8 GEMM's (non-symmetric) workspace.");
  k.def(
      "scaled_gemm",
      [](const g::ScaledGemmArgs& a, uintptr_t workspace, uintptr_t stream) {
        std::string why;
        check(g::run(a, reinterpret_cast<void*>(workspace), reinterpret_cast<cudaStream_t>(stream), &why), why,
              "scaled_gemm", -1);
      },
      py::arg("args"), py::arg("workspace"), py::arg("stream"), "Launch the FP8 GEMM; throws if it does not run.");
  k.def(
      "scaled_gemm_at",
      [](g::ScaledGemmArgs x, uintptr_t a, uintptr_t b, uintptr_t d, uintptr_t scale_a, uintptr_t scale_b,
         uintptr_t workspace, uintptr_t stream) {
        x.a = reinterpret_cast<const void*>(a);
        x.b = reinterpret_cast<const void*>(b);
        x.d = reinterpret_cast<void*>(d);
        x.scale_a = reinterpret_cast<const float*>(scale_a);
        x.scale_b = reinterpret_cast<const float*>(scale_b);
        std::string why;
        check(g::run(x, reinterpret_cast<void*>(workspace), reinterpret_cast<cudaStream_t>(stream), &why), why,
              "scaled_gemm", -1);
      },
      py::arg("args"), py::arg("a"), py::arg("b"), py::arg("d"), py::arg("scale_a"), py::arg("scale_b"),
      py::arg("workspace"), py::arg("stream"), "scaled_gemm on a copy of args with these addresses (as gemm_at).");
  k.def("preload_scaled_gemm_kernels", [] { check_cuda(g::preload_scaled_kernels(), "scaled_gemm.preload"); });
  // The arrival-aware tile scheduler's schedule (gemm.h ArrivalSchedule), less the communicator's device state,
  // which gemm_with_arrivals fills in from the communicator it is given.
  py::class_<g::ArrivalSchedule>(k, "ArrivalSchedule", "The AG+GEMM mainloop's arrival schedule (gemm.h).")
      .def(py::init<>())
      .def_readwrite("epoch", &g::ArrivalSchedule::epoch)
      .def_readwrite("chunk_rows", &g::ArrivalSchedule::chunk_rows)
      .def_readwrite("chunks", &g::ArrivalSchedule::chunks)
      .def_readwrite("first_chunk", &g::ArrivalSchedule::first_chunk)
      .def_readwrite("source_of_chunk0", &g::ArrivalSchedule::source_of_chunk0)
      .def_property(
          "flags", [](const g::ArrivalSchedule& s) { return reinterpret_cast<uintptr_t>(s.flags); },
          [](g::ArrivalSchedule& s, uintptr_t v) { s.flags = reinterpret_cast<const uint64_t*>(v); },
          "device address of the chunks' arrival flags (uint64 each)");
  k.def(
      "gemm_with_arrivals",
      [](const tandem::Communicator& c, g::GemmArgs a, g::ArrivalSchedule s, uintptr_t workspace, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());
        s.comm = c.device_comm();
        if (a.sm_count <= 0) a.sm_count = c.sm_count();
        std::string why;
        check(g::run_with_arrivals(a, s, reinterpret_cast<void*>(workspace), reinterpret_cast<cudaStream_t>(stream),
                                   &why),
              why, "gemm_with_arrivals", c.rank());
      },
      py::arg("comm"), py::arg("args"), py::arg("schedule"), py::arg("workspace"), py::arg("stream"),
      "The GEMM core with the arrival-aware tile scheduler (the AG+GEMM mainloop's contract); throws if it does not "
      "run. Timed-out waits are recorded in the communicator.");
  // Other configurations of the GEMM core (the op's per-shape choice, gemm_plan.py), their occupancy, and a
  // residency probe (gemm_variants.h). Failures throw tandem::Error with the adapter's status, like every launch.
  k.def("gemm_variant_names", [] { return g::variants::names(); });
  k.def(
      "gemm_variant",
      [](const std::string& name, const g::GemmArgs& a, uintptr_t stream, uintptr_t workspace) {
        std::string why;
        const Status s =
            g::variants::run(name, a, reinterpret_cast<cudaStream_t>(stream), &why, reinterpret_cast<void*>(workspace));
        check(s, name + ": " + (why.empty() ? std::string("failed") : why), "gemm", -1);
      },
      py::arg("name"), py::arg("args"), py::arg("stream"), py::arg("workspace") = 0,
      "bf16 D = A @ B with the named configuration; throws TandemError (its status) if it does not run. workspace: "
      "device memory of gemm_variant_workspace_size bytes (the split-K / stream-K configurations need one).");
  k.def(
      "gemm_variant_at",
      [](const std::string& name, g::GemmArgs x, uintptr_t a, uintptr_t b, uintptr_t d, uintptr_t stream,
         uintptr_t workspace) {
        x.a = reinterpret_cast<const void*>(a);
        x.b = reinterpret_cast<const void*>(b);
        x.d = reinterpret_cast<void*>(d);
        std::string why;
        const Status s =
            g::variants::run(name, x, reinterpret_cast<cudaStream_t>(stream), &why, reinterpret_cast<void*>(workspace));
        check(s, name + ": " + (why.empty() ? std::string("failed") : why), "gemm", -1);
      },
      py::arg("name"), py::arg("args"), py::arg("a"), py::arg("b"), py::arg("d"), py::arg("stream"),
      py::arg("workspace") = 0, "gemm_variant on a copy of args with these addresses (as gemm_at).");
  k.def(
      "gemm_variant_workspace_size",
      [](const std::string& name, const g::GemmArgs& a) {
        std::string why;
        size_t bytes = 0;
        const auto s = g::variants::workspace_size(name, a, &bytes, &why);
        check(s, why, "gemm_variant_workspace_size", -1);  // raises TandemError with the status
        return bytes;
      },
      "Bytes of workspace gemm_variant needs for these arguments (0 for the unsplit configurations).");
  k.def(
      "gemm_variant_occupancy",
      [](const std::string& name, const g::GemmArgs& a) {
        g::variants::Occupancy o;
        std::string why;
        check(g::variants::occupancy(name, a, &o, &why), why, "gemm_variant_occupancy", -1);
        py::dict r;
        r["grid_ctas"] = o.grid_ctas;
        r["cluster_size"] = o.cluster_size;
        r["max_active_clusters"] = o.max_active_clusters;
        r["smem_bytes"] = o.smem_bytes;
        return r;
      },
      "The persistent grid of a configuration at args.sm_count and what cudaOccupancyMaxActiveClusters says fits.");
  k.def(
      "residency_probe",
      [](int blocks, int cluster_x, int smem_bytes, int spin_us, uintptr_t timeline, uintptr_t stream) {
        std::string why;
        check(g::variants::residency_probe(blocks, cluster_x, smem_bytes, spin_us, reinterpret_cast<int64_t*>(timeline),
                                           reinterpret_cast<cudaStream_t>(stream), &why),
              why, "residency_probe", -1);
      },
      "CTAs that record [start ns, end ns, SM id] (int64 x 3 each) after spinning spin_us; throws if it does not run.");

  k.def(
      "gemm_host_costs",
      [](int reps, uintptr_t stream) {
        g::variants::HostCosts c;
        std::string why;
        check(g::variants::host_costs(reps, reinterpret_cast<cudaStream_t>(stream), &c, &why), why, "gemm_host_costs",
              -1);
        py::dict r;
        r["entry_point_lookup_us"] = c.entry_point_lookup_us;
        r["tensor_map_encode_us"] = c.tensor_map_encode_us;
        r["func_set_attribute_us"] = c.func_set_attribute_us;
        r["dynamic_smem_cached_us"] = c.dynamic_smem_cached_us;
        r["gemm_params_us"] = c.gemm_params_us;
        r["launch_plain_us"] = c.launch_plain_us;
        r["launch_cluster_us"] = c.launch_cluster_us;
        return r;
      },
      py::arg("reps") = 25, py::arg("stream") = 0,
      "Host microseconds a call of a GEMM launch's pieces (gemm_variants.h HostCosts); throws if a call fails.");

  // ---- stream-ordered flags between ranks (stream_sync.h): the TP ops' pipelined mode ------------------------------
  k.def("stream_advance", [](uintptr_t counter, uintptr_t stream) {
    std::string why;
    check(ss::advance(reinterpret_cast<uint64_t*>(counter), reinterpret_cast<cudaStream_t>(stream), &why), why,
          "stream_advance", -1);
  }, "*counter += 1 on the stream.");
  k.def(
      "stream_signal",
      [](const tandem::Communicator& c, uintptr_t flag, const std::vector<int>& peers, uintptr_t counter,
         int64_t offset, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());
        std::string why;
        check(ss::signal(c.device_comm(), reinterpret_cast<uint64_t*>(flag), peers.data(),
                         static_cast<int>(peers.size()), reinterpret_cast<const uint64_t*>(counter), offset,
                         reinterpret_cast<cudaStream_t>(stream), &why),
              why, "stream_signal", c.rank());
      },
      "Each peer's copy of symmetric flag `flag` := *counter + offset, after the stream's earlier work.");
  k.def("stream_copy", [](uintptr_t dst, uintptr_t src, size_t bytes, uintptr_t stream) {
    std::string why;
    check(ss::copy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
                   reinterpret_cast<cudaStream_t>(stream), &why),
          why, "stream_copy", -1);
  }, "cudaMemcpyAsync(cudaMemcpyDefault) on raw addresses (peer mappings included).");
  k.def("stream_copy_sm", [](uintptr_t dst, uintptr_t src, size_t bytes, int blocks, uintptr_t stream) {
    std::string why;
    check(ss::copy_on_sms(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes, blocks,
                          reinterpret_cast<cudaStream_t>(stream), &why),
          why, "stream_copy_sm", -1);
  }, "The same copy by a grid-stride kernel of `blocks` blocks (SMs, not the copy engines).");
  k.def("stream_sync_preload_kernels", [] { check_cuda(ss::preload_kernels(), "stream_sync.preload"); },
        "Load the stream-sync kernels now.");
  k.def(
      "stream_wait",
      [](const tandem::Communicator& c, const std::vector<uintptr_t>& flags, const std::vector<int>& writers,
         uintptr_t counter, int64_t offset, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());
        if (flags.size() != writers.size())
          throw tandem::Error(Status::kInvalidArgument, "stream_wait", c.rank(), -1, "flags and writers differ in length");
        std::vector<uint64_t*> f(flags.size());
        for (size_t i = 0; i < flags.size(); ++i) f[i] = reinterpret_cast<uint64_t*>(flags[i]);
        std::string why;
        check(ss::wait(c.device_comm(), f.data(), writers.data(), static_cast<int>(f.size()),
                       reinterpret_cast<const uint64_t*>(counter), offset, reinterpret_cast<cudaStream_t>(stream),
                       &why),
              why, "stream_wait", c.rank());
      },
      "Wait (bounded) until every flag >= *counter + offset; a timeout is recorded for comm.check().");

  // ---- TP: AG+GEMM, GEMM+RS, GEMM+AR (tp_gemm.h) -------------------------------------------------------------------
  py::class_<tp::SmPlan>(k, "SmPlan", "SMs this rank has, and the comm/reduce blocks of a fused kernel (even)")
      .def(py::init<>())
      .def_readwrite("sm_count", &tp::SmPlan::sm_count)
      .def_readwrite("comm_blocks", &tp::SmPlan::comm_blocks);
  k.def("default_plan", &tp::default_plan, py::arg("sm_count"),
        "The adapters' split when a call names none (a sixteenth of the SMs, even, at least 2).");
  {
    auto cls = bind_tp_args<tp::AgGemmArgs>(k, "AgGemmArgs");
    cls.def_readwrite("m_local", &tp::AgGemmArgs::m_local)
        .def_readwrite("n", &tp::AgGemmArgs::n)
        .def_readwrite("k", &tp::AgGemmArgs::k)
        .def_readwrite("ldb", &tp::AgGemmArgs::ldb)
        .def_readwrite("ldc", &tp::AgGemmArgs::ldc);
    def_address(cls, "a_local", &tp::AgGemmArgs::a_local);
    def_address(cls, "b", &tp::AgGemmArgs::b);
    def_address(cls, "c", &tp::AgGemmArgs::c);
    def_address(cls, "workspace", &tp::AgGemmArgs::workspace);
  }
  {
    auto cls = bind_tp_args<tp::GemmRsArgs>(k, "GemmRsArgs");
    cls.def_readwrite("m", &tp::GemmRsArgs::m)
        .def_readwrite("n", &tp::GemmRsArgs::n)
        .def_readwrite("k", &tp::GemmRsArgs::k)
        .def_readwrite("lda", &tp::GemmRsArgs::lda)
        .def_readwrite("ldb", &tp::GemmRsArgs::ldb)
        .def_readwrite("ticket", &tp::GemmRsArgs::ticket,
                       "the fused reduction: -1 as TANDEM_RS_TICKET says, 0 the reduce role, 1 tickets (one node)")
        .def_readwrite("ticket_rounds", &tp::GemmRsArgs::ticket_rounds,
                       "the ticket kernel's rounds: -1 as TANDEM_RS_TICKET_ROUNDS says, else 1 (none) to 8");
    def_address(cls, "a", &tp::GemmRsArgs::a);
    def_address(cls, "b", &tp::GemmRsArgs::b);
    def_address(cls, "out", &tp::GemmRsArgs::out);
    def_address(cls, "workspace", &tp::GemmRsArgs::workspace);
  }
  py::enum_<tp::ArAlgo>(k, "ArAlgo")
      .value("AUTO", tp::ArAlgo::kAuto)
      .value("ONE_SHOT", tp::ArAlgo::kOneShot)
      .value("TWO_SHOT", tp::ArAlgo::kTwoShot);
  py::class_<tp::GemmArArgs, tp::GemmRsArgs>(k, "GemmArArgs", "GemmRsArgs plus the all-reduce's algorithm; out is M x N")
      .def(py::init<>())
      .def_readwrite("algo", &tp::GemmArArgs::algo);
  def_comm_queries<tp::AgGemmArgs>(k, "this AG+GEMM");
  // GemmArArgs before its base: pybind11 takes the first overload that matches, and a GemmArArgs is a GemmRsArgs
  def_comm_queries<tp::GemmArArgs>(k, "this GEMM+AR");
  def_comm_queries<tp::GemmRsArgs>(k, "this GEMM+RS");
  k.def("gathered_offset", [](const tandem::Communicator& c, const tp::AgGemmArgs& a) {
    return tp::gathered_offset(with_comm(c, a));
  }, "Byte offset of the gathered A (world m_local x k) in the AG+GEMM workspace.");
  k.def("partial_offset", [](const tandem::Communicator& c, const tp::GemmRsArgs& a) {
    return tp::partial_offset(with_comm(c, a));
  }, "Byte offset of the M x N partial buffer in the GEMM+RS/AR workspace (the unfused path's GEMM output).");
  k.def("preload_kernels", [] { check_cuda(tp::preload_kernels(), "tp.preload"); },
        "Load every GEMM/TP kernel now (see tp_gemm.h).");
  k.def(
      "ag_gemm",
      [](const tandem::Communicator& c, const tp::AgGemmArgs& args, Mode mode, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());
        const auto a = with_comm(c, args);
        const auto st = reinterpret_cast<cudaStream_t>(stream);
        std::string why;
        if (mode == Mode::kFused) check(tp::run(a, st, &why), why, "ag_gemm", c.rank());
        else if (mode == Mode::kGather) check(tp::run_all_gather(a, st, &why), why, "ag_gemm", c.rank());
        else wrong_mode(mode, "ag_gemm", c.rank());
      },
      py::arg("comm"), py::arg("args"), py::arg("mode"), py::arg("stream"),
      "AllGather+GEMM: FUSED (one kernel) or GATHER (the all-gather alone); throws if it does not run.");
  const auto rs_like = [](const char* op) {
    return [op](const tandem::Communicator& c, const auto& args, Mode mode, uintptr_t stream) {
      tandem::ScopedDevice device_scope(c.device());
      const auto a = with_comm(c, args);
      const auto st = reinterpret_cast<cudaStream_t>(stream);
      std::string why;
      Status s = Status::kInternal;
      switch (mode) {
        case Mode::kFused: s = tp::run(a, st, &why); break;
        case Mode::kUnfused: s = tp::run_unfused(a, st, &why); break;
        case Mode::kWait: s = tp::run_wait_partial(a, st, &why); break;
        case Mode::kReduce: s = tp::run_reduce_only(a, st, &why); break;
        default: wrong_mode(mode, op, c.rank());
      }
      check(s, why, op, c.rank());
    };
  };
  k.def(
      "gemm_rs",
      [f = rs_like("gemm_rs")](const tandem::Communicator& c, const tp::GemmRsArgs& a, Mode mode, uintptr_t stream) {
        f(c, a, mode, stream);
      },
      py::arg("comm"), py::arg("args"), py::arg("mode"), py::arg("stream"),
      "GEMM+ReduceScatter: FUSED, UNFUSED (tandem's GEMM then the reduction kernel), WAIT (until the partial buffer "
      "is free: the caller's GEMM may write it next), REDUCE (the reduction alone over the partial buffer); throws "
      "if it does not run.");
  k.def(
      "gemm_ar",
      [f = rs_like("gemm_ar")](const tandem::Communicator& c, const tp::GemmArArgs& a, Mode mode, uintptr_t stream) {
        f(c, a, mode, stream);
      },
      py::arg("comm"), py::arg("args"), py::arg("mode"), py::arg("stream"),
      "GEMM+AllReduce: the modes of gemm_rs (REDUCE: the reduction and the gather of the reduced rows).");

  // ---- MoE: dispatch + grouped GEMM, combine (moe.h) ---------------------------------------------------------------
  py::class_<moe::MoeShape>(k, "MoeShape")
      .def(py::init<>())
      .def_readwrite("tokens", &moe::MoeShape::tokens)
      .def_readwrite("max_tokens", &moe::MoeShape::max_tokens)
      .def_readwrite("hidden", &moe::MoeShape::hidden)
      .def_readwrite("inter", &moe::MoeShape::inter)
      .def_readwrite("topk", &moe::MoeShape::topk)
      .def_readwrite("experts_per_rank", &moe::MoeShape::experts_per_rank);
  k.def("moe_layout_index", [](const moe::MoeShape& s, int world) {
    const auto li = moe::layout_index(s, world);
    return py::make_tuple(li.rows, li.offset, li.source, li.row_source, li.size);
  }, py::arg("shape"), py::arg("world"), "(rows, offset, source, row_source, size) of the dispatch layout array");
  k.def("moe_receive_capacity", &moe::receive_capacity, py::arg("shape"), py::arg("world"));
  k.def(
      "moe_dispatch_rows_sent",
      [](uintptr_t workspace) { return moe::dispatch_rows_sent(reinterpret_cast<const void*>(workspace)); },
      py::arg("workspace"),
      "Diagnostic (tests): token rows the last dispatch on this workspace put with dedup (synchronous; -1: error).");
  k.def("moe_last_grouped_gemm_cluster_rows", &moe::last_grouped_gemm_cluster_rows,
        "Diagnostic (tests): the cluster rows of the last moe_grouped_gemm launch, 2 or 1; 0 before any.");
  k.def("moe_last_gemm_cluster_rows", &moe::last_gemm_cluster_rows,
        "Diagnostic (tests): the cluster rows of the last unfused grouped-GEMM launch, 2 (default) or 1 "
        "(TANDEM_MOE_GEMM_CLUSTER=1); 0 before any.");
  {
    py::class_<moe::DispatchArgs> cls(k, "DispatchArgs");
    cls.def(py::init<>());
    def_dtype(cls);
    cls.def_readwrite("shape", &moe::DispatchArgs::shape).def_readwrite("plan", &moe::DispatchArgs::plan)
        .def_readwrite("dedup", &moe::DispatchArgs::dedup);
    def_address(cls, "x", &moe::DispatchArgs::x);
    def_address(cls, "topk_ids", &moe::DispatchArgs::topk_ids);
    def_address(cls, "w", &moe::DispatchArgs::w);
    def_address(cls, "y", &moe::DispatchArgs::y);
    def_address(cls, "rows", &moe::DispatchArgs::rows);
    def_address(cls, "layout", &moe::DispatchArgs::layout);
    def_address(cls, "workspace", &moe::DispatchArgs::workspace);
  }
  {
    py::class_<moe::CombineArgs> cls(k, "CombineArgs");
    cls.def(py::init<>());
    def_dtype(cls);
    cls.def_readwrite("shape", &moe::CombineArgs::shape)
        .def_readwrite("plan", &moe::CombineArgs::plan)
        .def_readwrite("dim", &moe::CombineArgs::dim);
    def_address(cls, "z", &moe::CombineArgs::z);
    def_address(cls, "topk_weights", &moe::CombineArgs::topk_weights);
    def_address(cls, "topk_ids", &moe::CombineArgs::topk_ids);
    def_address(cls, "out", &moe::CombineArgs::out);
    def_address(cls, "layout", &moe::CombineArgs::layout);
    def_address(cls, "workspace", &moe::CombineArgs::workspace);
  }
  {
    py::class_<moe::SwigluArgs> cls(k, "SwigluArgs");
    cls.def(py::init<>());
    def_dtype(cls);
    cls.def_readwrite("capacity", &moe::SwigluArgs::capacity)
        .def_readwrite("inter", &moe::SwigluArgs::inter)
        .def_readwrite("sm_count", &moe::SwigluArgs::sm_count);
    def_address(cls, "y", &moe::SwigluArgs::y);
    def_address(cls, "received", &moe::SwigluArgs::received);
    def_address(cls, "out", &moe::SwigluArgs::out);
  }
  {
    py::class_<moe::GroupedGemmArgs> cls(k, "GroupedGemmArgs");
    cls.def(py::init<>());
    def_dtype(cls);
    cls.def_readwrite("experts", &moe::GroupedGemmArgs::experts)
        .def_readwrite("n", &moe::GroupedGemmArgs::n)
        .def_readwrite("k", &moe::GroupedGemmArgs::k)
        .def_readwrite("sm_count", &moe::GroupedGemmArgs::sm_count)
        .def_readwrite("cluster_rows", &moe::GroupedGemmArgs::cluster_rows);
    def_address(cls, "a", &moe::GroupedGemmArgs::a);
    def_address(cls, "w", &moe::GroupedGemmArgs::w);
    def_address(cls, "d", &moe::GroupedGemmArgs::d);
    def_address(cls, "expert_rows", &moe::GroupedGemmArgs::expert_rows);
    def_address(cls, "expert_offset", &moe::GroupedGemmArgs::expert_offset);
    def_address(cls, "workspace", &moe::GroupedGemmArgs::workspace);
  }
  k.def(
      "moe_grouped_gemm_workspace_size", [](const moe::GroupedGemmArgs& args) { return moe::workspace_size(args); },
      py::arg("args"), "Bytes of device memory moe_grouped_gemm needs for these arguments (0: experts out of range).");
  k.def(
      "moe_grouped_gemm",
      [](const moe::GroupedGemmArgs& args, uintptr_t stream) {
        std::string why;
        check(moe::run(args, reinterpret_cast<cudaStream_t>(stream), &why), why, "moe_grouped_gemm", -1);
      },
      py::arg("args"), py::arg("stream"),
      "The local experts' grouped GEMM on rows in the dispatch layout (moe.h: GroupedGemmArgs); throws if it does "
      "not run. The launch goes to the current device.");
  k.def(
      "moe_swiglu",
      [](const moe::SwigluArgs& args, uintptr_t stream) {
        std::string why;
        check(moe::run(args, reinterpret_cast<cudaStream_t>(stream), &why), why, "moe_swiglu", -1);
      },
      py::arg("args"), py::arg("stream"),
      "SwiGLU of GEMM 1's rows over the received rows only (the count read on the device); throws if it does not "
      "run. The launch goes to the current device.");
  def_comm_queries<moe::DispatchArgs>(k, "this MoE dispatch + grouped GEMM");
  def_comm_queries<moe::CombineArgs>(k, "this MoE combine");
  k.def(
      "moe_dispatch_gemm",
      [](const tandem::Communicator& c, const moe::DispatchArgs& args, Mode mode, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());
        const auto a = with_comm(c, args);
        const auto st = reinterpret_cast<cudaStream_t>(stream);
        std::string why;
        if (mode == Mode::kFused) check(moe::run(a, st, &why), why, "moe_dispatch_gemm", c.rank());
        else if (mode == Mode::kUnfused) check(moe::run_unfused(a, st, &why), why, "moe_dispatch_gemm", c.rank());
        else if (mode == Mode::kDispatch) check(moe::run_dispatch(a, st, &why), why, "moe_dispatch_gemm", c.rank());
        else wrong_mode(mode, "moe_dispatch_gemm", c.rank());
      },
      py::arg("comm"), py::arg("args"), py::arg("mode"), py::arg("stream"),
      "MoE dispatch + grouped GEMM: FUSED or UNFUSED; DISPATCH: the dispatch alone, the received rows copied into "
      "args.rows (w null, y unused); throws if it does not run.");
  k.def(
      "moe_combine",
      [](const tandem::Communicator& c, const moe::CombineArgs& args, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());
        std::string why;
        check(moe::run(with_comm(c, args), reinterpret_cast<cudaStream_t>(stream), &why), why, "moe_combine", c.rank());
      },
      py::arg("comm"), py::arg("args"), py::arg("stream"), "MoE combine; throws if it does not run.");
  k.def("moe_trace_snapshot", [] {
    std::vector<uint64_t> v;
    check_cuda(moe::trace_snapshot(&v), "moe_trace_snapshot");
    return v;
  }, "Diagnostic: 512 blocks x 8 globaltimer slots of the last dispatch launched with TANDEM_MOE_TRACE=1.");
  k.def("tp_timeline_snapshot", [] {
    std::vector<uint64_t> v;
    check_cuda(tp::timeline_snapshot(&v), "tp_timeline_snapshot");
    return v;
  }, "Diagnostic: the last TP launch's per-block timeline (TANDEM_TP_TRACE=1): blocks x slots globaltimer "
     "stamps, the last slot SM id + 1 (tandem/kernels/runtime/trace.cuh); empty when tracing is off.");
  k.def("tp_timeline_slots", &tp::timeline_slots, "Diagnostic: slots per block in tp_timeline_snapshot().");
  k.def("tp_last_fused_rs_pieces", &tp::last_fused_rs_pieces,
        "Diagnostic: pieces a chunk took in the last fused GEMM+RS/AR launch (1: whole chunks; TANDEM_RS_PIECES).");
  k.def("tp_last_fused_rs_joined", &tp::last_fused_rs_joined,
        "Diagnostic: whether the last fused GEMM+RS/AR launch joined its reduction (TANDEM_RS_JOIN=1).");
  k.def("tp_last_fused_rs_ring", &tp::last_fused_rs_ring,
        "Whether this process's last fused GEMM+RS / two-shot GEMM+AR launch was the ring (TANDEM_RS_RING=1: the "
        "reduction in the GEMM epilogues, no reduce role).");
  k.def("tp_last_fused_rs_ticket", &tp::last_fused_rs_ticket,
        "Whether this process's last fused GEMM+RS / two-shot GEMM+AR launch was the ticket reduction "
        "(TANDEM_RS_TICKET=1: each tile's last rank to finish it adds every rank's partial; no reduce role).");
  k.def("tp_last_fused_claims", &tp::last_fused_claims,
        "Diagnostic: whether the last fused TP launch took its GEMM tiles by tile claims (the default; TANDEM_TP_CLAIM=0: the static stride).");
  k.def("tp_last_fused_gemm_tile_m", &tp::last_fused_gemm_tile_m,
        "Diagnostic: the tile M of the last fused TP launch's GEMM role (128, or 256 with TANDEM_TP_GEMM_TILE=256x128).");
  k.def("moe_preload_kernels", [] { check_cuda(moe::preload_kernels(), "moe.preload"); });

  // ---- ring attention (ring_attention.h) ---------------------------------------------------------------------------
  py::class_<attn::RingShape>(k, "RingShape")
      .def(py::init<>())
      .def_readwrite("batch", &attn::RingShape::batch)
      .def_readwrite("seq_local", &attn::RingShape::seq_local)
      .def_readwrite("heads_q", &attn::RingShape::heads_q)
      .def_readwrite("heads_kv", &attn::RingShape::heads_kv)
      .def_readwrite("head_dim", &attn::RingShape::head_dim)
      .def_readwrite("causal", &attn::RingShape::causal)
      .def_readwrite("softmax_scale", &attn::RingShape::softmax_scale);
  py::class_<attn::RingPlan>(k, "RingPlan")
      .def(py::init<>())
      .def_readwrite("sm_count", &attn::RingPlan::sm_count)
      .def_readwrite("comm_blocks", &attn::RingPlan::comm_blocks)
      .def_readwrite("kv_slots", &attn::RingPlan::kv_slots);
  {
    py::class_<attn::RingArgs> cls(k, "RingArgs");
    cls.def(py::init<>());
    def_dtype(cls);
    cls.def_readwrite("shape", &attn::RingArgs::shape).def_readwrite("plan", &attn::RingArgs::plan);
    def_address(cls, "q", &attn::RingArgs::q);
    def_address(cls, "k", &attn::RingArgs::k);
    def_address(cls, "v", &attn::RingArgs::v);
    def_address(cls, "o", &attn::RingArgs::o);
    def_address(cls, "lse", &attn::RingArgs::lse);
    def_address(cls, "workspace", &attn::RingArgs::workspace);
  }
  def_comm_queries<attn::RingArgs>(k, "this ring attention");
  k.def(
      "ring_attention",
      [](const tandem::Communicator& c, const attn::RingArgs& args, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());
        std::string why;
        check(attn::run(with_comm(c, args), reinterpret_cast<cudaStream_t>(stream), &why), why, "ring_attention",
              c.rank());
      },
      py::arg("comm"), py::arg("args"), py::arg("stream"), "Ring attention; throws if it does not run.");
  k.def("ring_schedule_slot_of", &attn::schedule::slot_of, "The slot step i uses (ring_schedule.h).");
  k.def("ring_schedule_previous_use", &attn::schedule::previous_use,
        "(epoch, world, slots, step): the global step whose use of step's slot must be released first.");
  k.def("ring_attention_preload_kernels", [] { check_cuda(attn::preload_kernels(), "ring_attention.preload"); },
        "Load the ring-attention kernels now (see ring_attention.h).");
}

}  // namespace tandem_py

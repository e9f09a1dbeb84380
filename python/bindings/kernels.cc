// Bindings of the kernels layer (raw pointers + stream; validation happens in tandem.ops before launch).
#include <cuda_runtime_api.h>

#include <pybind11/stl.h>

#include "common.h"
#include "tandem/kernels/attention/ring_attention.h"
#include "tandem/kernels/attention/ring_schedule.h"
#include "tandem/kernels/fused/tp_gemm.h"
#include "tandem/kernels/gemm/gemm.h"
#include "tandem/kernels/gemm/gemm_variants.h"
#include "tandem/kernels/moe/moe.h"
#include "tandem/kernels/stream_sync.h"
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
  k.def("gemm_workspace_size",
        [args](int m_, int n, int k_, int dtype) {
          return g::workspace_size(args(m_, n, k_, dtype, 16, k_, 16, n, 16, n, 1.0f, 0));
        });
  k.def(
      "gemm",
      [args](int m_, int n, int k_, int dtype, uintptr_t a, int64_t lda, uintptr_t b, int64_t ldb, uintptr_t d,
             int64_t ldd, float alpha, int sm_count, uintptr_t workspace, uintptr_t stream, int swizzle) {
        std::string why;
        auto x = args(m_, n, k_, dtype, a, lda, b, ldb, d, ldd, alpha, sm_count);
        x.max_swizzle = swizzle;
        const auto s = g::run(x, reinterpret_cast<void*>(workspace), reinterpret_cast<cudaStream_t>(stream), &why);
        return s == tandem::Status::kOk ? std::string() : (why.empty() ? std::string("failed") : why);
      },
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype"), py::arg("a"), py::arg("lda"), py::arg("b"),
      py::arg("ldb"), py::arg("d"), py::arg("ldd"), py::arg("alpha"), py::arg("sm_count"), py::arg("workspace"),
      py::arg("stream"), py::arg("swizzle") = 1,
      "Launch; returns '' or the reason it did not run. swizzle: the persistent scheduler's (1, 2, 4, 8).");
  // Stream-ordered flags between ranks (stream_sync.h): the TP ops' pipelined mode. Each returns '' or the reason.
  namespace ss = tandem::kernels::stream_sync;
  auto result = [](tandem::Status s, const std::string& why) {
    return s == tandem::Status::kOk ? std::string() : (why.empty() ? std::string("failed") : why);
  };
  k.def("stream_advance", [result](uintptr_t counter, uintptr_t stream) {
    std::string why;
    return result(ss::advance(reinterpret_cast<uint64_t*>(counter), reinterpret_cast<cudaStream_t>(stream), &why), why);
  }, "*counter += 1 on the stream.");
  k.def(
      "stream_signal",
      [result](const tandem::Communicator& c, uintptr_t flag, const std::vector<int>& peers, uintptr_t counter,
               int64_t offset, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
        std::string why;
        return result(ss::signal(c.device_comm(), reinterpret_cast<uint64_t*>(flag), peers.data(),
                                 static_cast<int>(peers.size()), reinterpret_cast<const uint64_t*>(counter), offset,
                                 reinterpret_cast<cudaStream_t>(stream), &why), why);
      },
      "Each peer's copy of symmetric flag `flag` := *counter + offset, after the stream's earlier work.");
  k.def("stream_copy", [result](uintptr_t dst, uintptr_t src, size_t bytes, uintptr_t stream) {
    std::string why;
    return result(ss::copy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
                           reinterpret_cast<cudaStream_t>(stream), &why), why);
  }, "cudaMemcpyAsync(cudaMemcpyDefault) on raw addresses (peer mappings included).");
  k.def("stream_copy_sm", [result](uintptr_t dst, uintptr_t src, size_t bytes, int blocks, uintptr_t stream) {
    std::string why;
    return result(ss::copy_on_sms(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes, blocks,
                                  reinterpret_cast<cudaStream_t>(stream), &why), why);
  }, "The same copy by a grid-stride kernel of `blocks` blocks (SMs, not the copy engines).");
  k.def("stream_sync_preload_kernels", [] {
    const cudaError_t e = ss::preload_kernels();
    return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
  }, "Load the stream-sync kernels now; '' or the CUDA error.");
  k.def(
      "stream_wait",
      [result](const tandem::Communicator& c, const std::vector<uintptr_t>& flags, const std::vector<int>& writers,
               uintptr_t counter, int64_t offset, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
        std::string why;
        if (flags.size() != writers.size()) return std::string("flags and writers differ in length");
        std::vector<uint64_t*> f(flags.size());
        for (size_t i = 0; i < flags.size(); ++i) f[i] = reinterpret_cast<uint64_t*>(flags[i]);
        return result(ss::wait(c.device_comm(), f.data(), writers.data(), static_cast<int>(f.size()),
                               reinterpret_cast<const uint64_t*>(counter), offset,
                               reinterpret_cast<cudaStream_t>(stream), &why), why);
      },
      "Wait (bounded) until every flag >= *counter + offset; a timeout is recorded for comm.check().");
  // Measurement only (tools/diag/gemm_mps.py): other configurations of the GEMM core, their occupancy, and a
  // residency probe (gemm_variants.h).
  k.def("gemm_variant_names", [] { return g::variants::names(); });
  k.def(
      "gemm_variant",
      [args](const std::string& name, int m_, int n, int k_, uintptr_t a, int64_t lda, uintptr_t b, int64_t ldb,
             uintptr_t d, int64_t ldd, int sm_count, uintptr_t stream) {
        std::string why;
        const auto s = g::variants::run(name, args(m_, n, k_, 0, a, lda, b, ldb, d, ldd, 1.0f, sm_count),
                                        reinterpret_cast<cudaStream_t>(stream), &why);
        return s == tandem::Status::kOk ? std::string() : (why.empty() ? std::string("failed") : why);
      },
      "bf16 D = A @ B with the named configuration; returns '' or the reason it did not run.");
  k.def(
      "gemm_variant_occupancy",
      [args](const std::string& name, int m_, int n, int k_, int sm_count) {
        g::variants::Occupancy o;
        std::string why;
        const auto s = g::variants::occupancy(name, args(m_, n, k_, 0, 16, k_, 16, n, 16, n, 1.0f, sm_count), &o, &why);
        py::dict r;
        if (s != tandem::Status::kOk) {
          r["error"] = why;
          return r;
        }
        r["grid_ctas"] = o.grid_ctas;
        r["cluster_size"] = o.cluster_size;
        r["max_active_clusters"] = o.max_active_clusters;
        r["smem_bytes"] = o.smem_bytes;
        return r;
      },
      "The persistent grid of a configuration at sm_count and what cudaOccupancyMaxActiveClusters says fits.");
  k.def(
      "residency_probe",
      [](int blocks, int cluster_x, int smem_bytes, int spin_us, uintptr_t timeline, uintptr_t stream) {
        std::string why;
        const auto s = g::variants::residency_probe(blocks, cluster_x, smem_bytes, spin_us,
                                                    reinterpret_cast<int64_t*>(timeline),
                                                    reinterpret_cast<cudaStream_t>(stream), &why);
        return s == tandem::Status::kOk ? std::string() : why;
      },
      "CTAs that record [start ns, end ns, SM id] (int64 x 3 each) after spinning spin_us; '' or the reason.");
  k.def(
      "gemm_with_arrivals",
      [args](const tandem::Communicator& c, int m_, int n, int k_, int dtype, uintptr_t a, int64_t lda, uintptr_t b,
             int64_t ldb, uintptr_t d, int64_t ldd, uintptr_t flags, uint64_t epoch, int chunk_rows, int chunks,
             int first_chunk, int source_of_chunk0, uintptr_t workspace, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
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

  namespace tp = tandem::kernels::tp;
  // The TP ops' mode dispatch: "check" (can_implement), "fused" (run), anything else `other`; '' or the reason.
  const auto run_tp_mode = [](const auto& x, const std::string& mode, uintptr_t stream, auto other) {
    auto st = reinterpret_cast<cudaStream_t>(stream);
    std::string why;
    tandem::Status s;
    if (mode == "check") {
      s = tp::can_implement(x, &why);
    } else if (mode == "fused") {
      s = tp::run(x, st, &why);
    } else {
      s = other(x, st, &why);
    }
    return s == tandem::Status::kOk ? std::string() : (why.empty() ? std::string("failed") : why);
  };
  auto ag_args = [](const tandem::Communicator& c, int dtype, int m_local, int n, int k_, uintptr_t a, uintptr_t b,
                    int64_t ldb, uintptr_t cc, int64_t ldc, uintptr_t ws, int sm_count, int comm_blocks) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
    tp::AgGemmArgs x;
    x.dtype = static_cast<g::DType>(dtype);
    x.m_local = m_local;
    x.n = n;
    x.k = k_;
    x.a_local = reinterpret_cast<const void*>(a);
    x.b = reinterpret_cast<const void*>(b);
    x.ldb = ldb;
    x.c = reinterpret_cast<void*>(cc);
    x.ldc = ldc;
    x.workspace = reinterpret_cast<void*>(ws);
    x.plan.sm_count = sm_count > 0 ? sm_count : c.sm_count();
    x.plan.comm_blocks = comm_blocks;
    x.comm = c.device_comm();
    x.ranks_per_node = c.uniform_ranks_per_node();
    return x;
  };
  k.def("ag_gemm_workspace_size", [ag_args](const tandem::Communicator& c, int m_local, int k_) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
    return tp::workspace_size(ag_args(c, 0, m_local, 8, k_, 0, 0, 8, 0, 8, 0, 0, 0));
  });
  k.def("ag_gemm_gathered_offset", [ag_args](const tandem::Communicator& c, int m_local, int k_) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
    return tp::gathered_offset(ag_args(c, 0, m_local, 8, k_, 0, 0, 8, 0, 8, 0, 0, 0));
  });
  k.def("preload_kernels", [] {
    const cudaError_t e = tp::preload_kernels();
    return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
  }, "Load every GEMM/TP kernel now (see tp_gemm.h); '' or the CUDA error.");
  k.def(
      "ag_gemm",
      [ag_args, run_tp_mode](const tandem::Communicator& c, const std::string& mode, int dtype, int m_local, int n, int k_,
                uintptr_t a, uintptr_t b, int64_t ldb, uintptr_t cc, int64_t ldc, uintptr_t ws, int sm_count,
                int comm_blocks, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
        auto x = ag_args(c, dtype, m_local, n, k_, a, b, ldb, cc, ldc, ws, sm_count, comm_blocks);
        // any other mode ("gather"): the copy blocks alone (the caller runs the GEMM on the gathered A)
        return run_tp_mode(x, mode, stream, [](const auto& y, cudaStream_t st, std::string* why) {
          return tp::run_all_gather(y, st, why);
        });
      },
      "AllGather+GEMM: mode 'fused' (one kernel), 'gather' (all-gather only), 'check' (can_implement); returns '' "
      "or the reason.");
  auto rs_args = [](const tandem::Communicator& c, int dtype, int m_, int n, int k_, uintptr_t a, int64_t lda,
                    uintptr_t b, int64_t ldb, uintptr_t out, uintptr_t ws, int sm_count, int comm_blocks) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
    tp::GemmRsArgs x;
    x.dtype = static_cast<g::DType>(dtype);
    x.m = m_;
    x.n = n;
    x.k = k_;
    x.a = reinterpret_cast<const void*>(a);
    x.lda = lda;
    x.b = reinterpret_cast<const void*>(b);
    x.ldb = ldb;
    x.out = reinterpret_cast<void*>(out);
    x.workspace = reinterpret_cast<void*>(ws);
    x.plan.sm_count = sm_count > 0 ? sm_count : c.sm_count();
    x.plan.comm_blocks = comm_blocks;
    x.comm = c.device_comm();
    x.ranks_per_node = c.uniform_ranks_per_node();
    return x;
  };
  k.def("gemm_rs_workspace_size", [rs_args](const tandem::Communicator& c, int m_, int n) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
    return tp::workspace_size(rs_args(c, 0, m_, n, 8, 0, 8, 0, 8, 0, 0, 0, 0));
  });
  k.def(
      "gemm_rs",
      [rs_args, run_tp_mode](const tandem::Communicator& c, const std::string& mode, int dtype, int m_, int n, int k_, uintptr_t a,
                int64_t lda, uintptr_t b, int64_t ldb, uintptr_t out, uintptr_t ws, int sm_count, int comm_blocks,
                uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
        auto x = rs_args(c, dtype, m_, n, k_, a, lda, b, ldb, out, ws, sm_count, comm_blocks);
        return run_tp_mode(x, mode, stream, [&mode](const auto& y, cudaStream_t st, std::string* why) {
          if (mode == "wait") return tp::run_wait_partial(y, st, why);
          return mode == "reduce" ? tp::run_reduce_only(y, st, why) : tp::run_unfused(y, st, why);
        });
      },
      "GEMM+ReduceScatter: mode 'fused', 'unfused' (GEMM then reduction kernel), 'reduce' (the reduction kernel "
      "alone, over the workspace's partial buffer: the collective's own time), 'wait' (until the partial buffer "
      "is free: the caller's GEMM may write it next), 'check'; returns '' or the reason.");
  k.def("gemm_rs_partial_offset", [rs_args](const tandem::Communicator& c, int m_, int n) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
    return tp::partial_offset(rs_args(c, 0, m_, n, 8, 0, 8, 0, 8, 0, 0, 0, 0));
  }, "Byte offset of the M x N partial buffer in the GEMM+RS/AR workspace (the unfused path's GEMM output).");
  k.def(
      "gemm_ar",
      [rs_args, run_tp_mode](const tandem::Communicator& c, const std::string& mode, int dtype, int m_, int n, int k_, uintptr_t a,
                int64_t lda, uintptr_t b, int64_t ldb, uintptr_t out, uintptr_t ws, int sm_count, int comm_blocks,
                uintptr_t stream, int algo) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
        tp::GemmArArgs x;
        static_cast<tp::GemmRsArgs&>(x) = rs_args(c, dtype, m_, n, k_, a, lda, b, ldb, out, ws, sm_count, comm_blocks);
        x.algo = static_cast<tp::ArAlgo>(algo);
        return run_tp_mode(x, mode, stream, [&mode](const auto& y, cudaStream_t st, std::string* why) {
          if (mode == "wait") return tp::run_wait_partial(y, st, why);
          return mode == "reduce" ? tp::run_reduce_only(y, st, why) : tp::run_unfused(y, st, why);
        });
      },
      "GEMM+AllReduce: mode 'fused', 'unfused', 'check'; algo 0 auto, 1 one-shot, 2 two-shot (reduce-scatter, then "
      "all-gather of the reduced rows); returns '' or the reason. The workspace is gemm_rs_workspace_size's.",
      py::arg("comm"), py::arg("mode"), py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("a"),
      py::arg("lda"), py::arg("b"), py::arg("ldb"), py::arg("out"), py::arg("workspace"), py::arg("sm_count"),
      py::arg("comm_blocks"), py::arg("stream"), py::arg("algo") = 0);

  // MoE (expert parallelism): dispatch + grouped GEMM, combine.
  namespace moe = tandem::kernels::moe;
  auto moe_shape = [](int tokens, int max_tokens, int hidden, int inter, int topk, int experts_per_rank) {
    moe::MoeShape s;
    s.tokens = tokens;
    s.max_tokens = max_tokens;
    s.hidden = hidden;
    s.inter = inter;
    s.topk = topk;
    s.experts_per_rank = experts_per_rank;
    return s;
  };
  k.def("moe_layout_index", [moe_shape](int world, int max_tokens, int topk, int experts_per_rank) {
    const auto li = moe::layout_index(moe_shape(0, max_tokens, 8, 8, topk, experts_per_rank), world);
    return py::make_tuple(li.rows, li.offset, li.source, li.row_source, li.size);
  }, "(rows, offset, source, row_source, size) of the dispatch layout array (moe.h)");
  k.def("moe_receive_capacity", [moe_shape](int world, int max_tokens, int topk, int experts_per_rank) {
    return moe::receive_capacity(moe_shape(0, max_tokens, 8, 8, topk, experts_per_rank), world);
  });
  auto dispatch_args = [moe_shape](const tandem::Communicator& c, int dtype, int tokens, int max_tokens, int hidden,
                                   int inter, int topk, int epr, uintptr_t x, uintptr_t ids, uintptr_t w, uintptr_t y,
                                   uintptr_t layout, uintptr_t ws, int sm_count, int comm_blocks) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
    moe::DispatchArgs a;
    a.dtype = static_cast<g::DType>(dtype);
    a.shape = moe_shape(tokens, max_tokens, hidden, inter, topk, epr);
    a.x = reinterpret_cast<const void*>(x);
    a.topk_ids = reinterpret_cast<const int32_t*>(ids);
    a.w = reinterpret_cast<const void*>(w);
    a.y = reinterpret_cast<void*>(y);
    a.layout = reinterpret_cast<int32_t*>(layout);
    a.workspace = reinterpret_cast<void*>(ws);
    a.plan.sm_count = sm_count > 0 ? sm_count : c.sm_count();
    a.plan.comm_blocks = comm_blocks;
    a.comm = c.device_comm();
    return a;
  };
  k.def("moe_dispatch_workspace_size",
        [dispatch_args](const tandem::Communicator& c, int max_tokens, int hidden, int inter, int topk, int epr) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
          return moe::workspace_size(dispatch_args(c, 0, 0, max_tokens, hidden, inter, topk, epr, 0, 0, 0, 0, 0, 0, 0, 0));
        });
  k.def(
      "moe_dispatch_gemm",
      [dispatch_args](const tandem::Communicator& c, const std::string& mode, int dtype, int tokens, int max_tokens,
                      int hidden, int inter, int topk, int epr, uintptr_t x, uintptr_t ids, uintptr_t w, uintptr_t y,
                      uintptr_t layout, uintptr_t ws, int sm_count, int comm_blocks, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
        const auto a = dispatch_args(c, dtype, tokens, max_tokens, hidden, inter, topk, epr, x, ids, w, y, layout, ws,
                                     sm_count, comm_blocks);
        std::string why;
        tandem::Status s;
        const auto st = reinterpret_cast<cudaStream_t>(stream);
        if (mode == "check") s = moe::can_implement(a, &why);
        else if (mode == "fused") s = moe::run(a, st, &why);
        else s = moe::run_unfused(a, st, &why);
        return s == tandem::Status::kOk ? std::string() : (why.empty() ? std::string("failed") : why);
      },
      "MoE dispatch + grouped GEMM: mode 'fused', 'unfused', 'check'; returns '' or the reason.");
  auto combine_args = [moe_shape](const tandem::Communicator& c, int dtype, int tokens, int max_tokens, int topk,
                                  int epr, int dim, uintptr_t z, uintptr_t weights, uintptr_t ids, uintptr_t layout,
                                  uintptr_t out, uintptr_t ws, int sm_count) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
    moe::CombineArgs a;
    a.dtype = static_cast<g::DType>(dtype);
    a.shape = moe_shape(tokens, max_tokens, 8, 8, topk, epr);
    a.dim = dim;
    a.z = reinterpret_cast<const void*>(z);
    a.topk_weights = reinterpret_cast<const float*>(weights);
    a.topk_ids = reinterpret_cast<const int32_t*>(ids);
    a.layout = reinterpret_cast<const int32_t*>(layout);
    a.out = reinterpret_cast<void*>(out);
    a.workspace = reinterpret_cast<void*>(ws);
    a.plan.sm_count = sm_count > 0 ? sm_count : c.sm_count();
    a.comm = c.device_comm();
    return a;
  };
  k.def("moe_combine_workspace_size",
        [combine_args](const tandem::Communicator& c, int max_tokens, int topk, int epr, int dim) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
          return moe::workspace_size(combine_args(c, 0, 0, max_tokens, topk, epr, dim, 0, 0, 0, 0, 0, 0, 0));
        });
  k.def(
      "moe_combine",
      [combine_args](const tandem::Communicator& c, const std::string& mode, int dtype, int tokens, int max_tokens,
                     int topk, int epr, int dim, uintptr_t z, uintptr_t weights, uintptr_t ids, uintptr_t layout,
                     uintptr_t out, uintptr_t ws, int sm_count, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
        const auto a = combine_args(c, dtype, tokens, max_tokens, topk, epr, dim, z, weights, ids, layout, out, ws,
                                    sm_count);
        std::string why;
        const tandem::Status s = mode == "check" ? moe::can_implement(a, &why)
                                                 : moe::run(a, reinterpret_cast<cudaStream_t>(stream), &why);
        return s == tandem::Status::kOk ? std::string() : (why.empty() ? std::string("failed") : why);
      },
      "MoE combine: mode 'run' or 'check'; returns '' or the reason.");
  k.def("moe_trace_snapshot", [] {
    std::vector<uint64_t> v;
    const cudaError_t e = moe::trace_snapshot(&v);
    if (e != cudaSuccess) throw std::runtime_error(cudaGetErrorString(e));
    return v;
  }, "Diagnostic: 512 blocks x 8 globaltimer slots of the last dispatch launched with TANDEM_MOE_TRACE=1.");
  k.def("moe_preload_kernels", [] {
    const cudaError_t e = moe::preload_kernels();
    return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
  });

  // Ring attention (sequence parallelism): one persistent kernel; K/V blocks travel around the ring of ranks.
  namespace attn = tandem::kernels::attention;
  auto ring_args = [](const tandem::Communicator& c, int dtype, int batch, int seq_local, int heads_q, int heads_kv,
                      int head_dim, bool causal, float softmax_scale, uintptr_t q, uintptr_t k_, uintptr_t v,
                      uintptr_t o, uintptr_t lse, uintptr_t ws, int sm_count, int comm_blocks, int kv_slots) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
    attn::RingArgs a;
    a.dtype = static_cast<g::DType>(dtype);
    a.shape.batch = batch;
    a.shape.seq_local = seq_local;
    a.shape.heads_q = heads_q;
    a.shape.heads_kv = heads_kv;
    a.shape.head_dim = head_dim;
    a.shape.causal = causal;
    a.shape.softmax_scale = softmax_scale;
    a.q = reinterpret_cast<const void*>(q);
    a.k = reinterpret_cast<const void*>(k_);
    a.v = reinterpret_cast<const void*>(v);
    a.o = reinterpret_cast<void*>(o);
    a.lse = reinterpret_cast<float*>(lse);
    a.workspace = reinterpret_cast<void*>(ws);
    a.plan.sm_count = sm_count > 0 ? sm_count : c.sm_count();
    a.plan.comm_blocks = comm_blocks;
    a.plan.kv_slots = kv_slots;
    a.comm = c.device_comm();
    return a;
  };
  k.def(
      "ring_attention_workspace_size",
      [ring_args](const tandem::Communicator& c, int batch, int seq_local, int heads_q, int heads_kv, int head_dim,
                  bool causal, int kv_slots) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
        return attn::workspace_size(ring_args(c, 0, batch, seq_local, heads_q, heads_kv, head_dim, causal, 0.f, 0, 0,
                                              0, 0, 0, 0, 0, 0, kv_slots));
      },
      "Bytes of the symmetric workspace for this shape, world and kv_slots (the same for bf16 and fp16).");
  k.def(
      "ring_attention",
      [ring_args](const tandem::Communicator& c, const std::string& mode, int dtype, int batch, int seq_local,
                  int heads_q, int heads_kv, int head_dim, bool causal, float softmax_scale, uintptr_t q,
                  uintptr_t k_, uintptr_t v, uintptr_t o, uintptr_t lse, uintptr_t ws, int sm_count, int comm_blocks,
                  int kv_slots, uintptr_t stream) {
        tandem::ScopedDevice device_scope(c.device());  // launches go to the communicator's GPU
        const auto a = ring_args(c, dtype, batch, seq_local, heads_q, heads_kv, head_dim, causal, softmax_scale, q,
                                 k_, v, o, lse, ws, sm_count, comm_blocks, kv_slots);
        std::string why;
        const tandem::Status s = mode == "check" ? attn::can_implement(a, &why)
                                                 : attn::run(a, reinterpret_cast<cudaStream_t>(stream), &why);
        return s == tandem::Status::kOk ? std::string() : (why.empty() ? std::string("failed") : why);
      },
      "Ring attention: mode 'run' or 'check' (can_implement); returns '' or the reason.");
  k.def("ring_schedule_slot_of", &attn::schedule::slot_of, "The slot step i uses (ring_schedule.h).");
  k.def("ring_schedule_previous_use", &attn::schedule::previous_use,
        "(epoch, world, slots, step): the global step whose use of step's slot must be released first.");
  k.def("ring_attention_preload_kernels", [] {
    const cudaError_t e = attn::preload_kernels();
    return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
  }, "Load the ring-attention kernels now (see ring_attention.h); '' or the CUDA error.");
}

}  // namespace tandem_py

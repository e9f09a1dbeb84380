// Bindings of the verbs work-request planner (tandem/transport/verbs_plan.h): used by the pyverbs-based
// backend (python/tandem/transport/verbs.py) and by its unit tests.
#include <pybind11/stl.h>

#include "common.h"
#include "tandem/transport/verbs_plan.h"

namespace tandem_py {

namespace {

using namespace tandem::verbs;

template <class T>
T get(const py::dict& d, const char* k, T dflt) {
  return d.contains(k) ? d[k].cast<T>() : dflt;
}

py::dict wr_dict(const Wr& w) {
  static const char* names[] = {"write", "write_inline", "atomic_fetch_add"};
  py::dict d;
  d["wr_id"] = w.wr_id;
  d["opcode"] = names[static_cast<int>(w.opcode)];
  d["local_addr"] = w.local_addr;
  d["lkey"] = w.lkey;
  d["length"] = w.length;
  d["remote_addr"] = w.remote_addr;
  d["rkey"] = w.rkey;
  d["value"] = w.value;
  d["signaled"] = w.signaled;
  d["fence"] = w.fence;
  return d;
}

}  // namespace

void bind_verbs(py::module_& m) {
  py::module_ v = m.def_submodule("verbs", "RDMA verbs planning (pure logic; the resources live in pyverbs).");
  py::class_<WrPlanner>(v, "WrPlanner")
      .def(py::init([](const py::dict& local, const py::dict& peers, const py::dict& opts) {
             LocalRegion l;
             l.base = get<uint64_t>(local, "base", 0);
             l.lkey = get<uint32_t>(local, "lkey", 0);
             l.bytes = get<uint64_t>(local, "bytes", 0);
             l.scratch_addr = get<uint64_t>(local, "scratch_addr", 0);
             l.scratch_lkey = get<uint32_t>(local, "scratch_lkey", 0);
             std::map<int, RemoteRegion> p;
             for (auto item : peers) {
               auto d = item.second.cast<py::dict>();
               p[item.first.cast<int>()] = RemoteRegion{get<uint64_t>(d, "base", 0), get<uint32_t>(d, "rkey", 0),
                                                        get<uint64_t>(d, "bytes", 0)};
             }
             PlanOptions o;
             o.qps_per_peer = get<uint32_t>(opts, "qps_per_peer", o.qps_per_peer);
             o.max_batch = get<uint32_t>(opts, "max_batch", o.max_batch);
             o.signal_every = get<uint32_t>(opts, "signal_every", o.signal_every);
             o.sq_depth = get<uint32_t>(opts, "sq_depth", o.sq_depth);
             o.max_wr_bytes = get<uint32_t>(opts, "max_wr_bytes", o.max_wr_bytes);
             return std::make_unique<WrPlanner>(l, std::move(p), o);
           }),
           py::arg("local"), py::arg("peers"), py::arg("options") = py::dict())
      .def(
          "add",
          [](WrPlanner& w, const py::dict& c, uint64_t ticket) {
            tandem::proxy::Command cmd{};
            cmd.peer = get<int>(c, "peer", 0);
            cmd.op = command_op_code(get<std::string>(c, "op", ""), "verbs.plan", cmd.peer);
            cmd.channel = get<uint16_t>(c, "channel", 0);
            cmd.signal_op = signal_op_code(get<std::string>(c, "signal_op", "set"), "verbs.plan", cmd.peer);
            cmd.src_offset = get<uint64_t>(c, "src", 0);
            cmd.dst_offset = get<uint64_t>(c, "dst", 0);
            cmd.bytes = get<uint64_t>(c, "bytes", 0);
            cmd.sig_offset = get<uint64_t>(c, "sig", 0);
            cmd.sig_value = get<uint64_t>(c, "value", 0);
            w.add(cmd, ticket);
          },
          py::arg("command"), py::arg("ticket"))
      .def(
          "take",
          [](WrPlanner& w, bool flush) {
            py::list out;
            for (const auto& b : w.take(flush)) {
              py::dict d;
              d["peer"] = b.peer;
              d["qp"] = b.qp;
              py::list wrs;
              for (const auto& x : b.wrs) wrs.append(wr_dict(x));
              d["wrs"] = wrs;
              out.append(d);
            }
            return out;
          },
          py::arg("flush") = false)
      .def("complete", &WrPlanner::complete, py::arg("wr_id"))
      .def("outstanding", &WrPlanner::outstanding, py::arg("peer"), py::arg("qp"));
}

}  // namespace tandem_py

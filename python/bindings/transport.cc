#include <pybind11/stl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "common.h"
#include "tandem/transport/allocator.h"
#include "tandem/transport/comm.h"
#include "tandem/transport/proxy.h"
#include "fd_passing.h"
#include "peer_monitor.h"
#include "unix_socket.h"

namespace tandem_py {

void raise_tandem_error(const tandem::Error& e) {
  py::object cls = py::module_::import("tandem.errors").attr("TandemError");
  py::object exc = cls(e.what(), static_cast<int>(e.status()), e.op(), e.rank(), e.peer());
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

void check_launch(tandem::Status s, const char* op, int rank) {
  if (s != tandem::Status::kOk) throw tandem::Error(s, op, rank, -1, "launch rejected");
}

namespace {

// Bootstrap over any object with set(key: str, value: bytes) and get(key: str) -> bytes, e.g. a
// torch.distributed Store (TCPStore/FileStore/PrefixStore). Called with the GIL held (setup runs in the
// constructor's thread).
class PyStoreBootstrap final : public tandem::Bootstrap {
 public:
  PyStoreBootstrap(py::object store, int rank, int world) : store_(std::move(store)), rank_(rank), world_(world) {}
  ~PyStoreBootstrap() override {
    py::gil_scoped_acquire gil;
    store_ = py::object();
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void set(const std::string& key, const std::string& value) override {
    py::gil_scoped_acquire gil;
    store_.attr("set")(key, py::bytes(value));
  }
  std::string get(const std::string& key) override {
    py::gil_scoped_acquire gil;
    try {
      return store_.attr("get")(key).cast<std::string>();
    } catch (py::error_already_set& e) {
      throw tandem::Error(tandem::Status::kBootstrapError, "bootstrap.get", rank_, -1,
                          "store get(" + key + ") failed: " + std::string(e.what()));
    }
  }

 private:
  py::object store_;
  int rank_, world_;
};

}  // namespace

// DLPack (v0.8 ABI, the "dltensor" capsule torch.from_dlpack takes), written out here because the bindings do
// not build against torch. Used for peer views: a __cuda_array_interface__ carries no device, so torch infers it
// from the pointer -- for a mapping of another GPU's memory, that GPU -- and .to(this device) then *copies*; a
// DLPack tensor names its device, and torch takes the pointer as is.
namespace dlpack {
struct Device {
  int32_t device_type;  // kDLCUDA = 2
  int32_t device_id;
};
struct DataType {
  uint8_t code;  // kDLUInt = 1
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct Managed {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(Managed* self);
};
// What a capsule owns: the tensor, its shape, and a reference to the Python object that keeps the memory mapped.
struct Context {
  Managed managed{};
  int64_t shape[1] = {0};
  PyObject* owner = nullptr;
};
void delete_managed(Managed* m) {
  auto* ctx = static_cast<Context*>(m->manager_ctx);
  if (Py_IsInitialized()) {  // the last tensor may go on any thread, and without the GIL
    py::gil_scoped_acquire gil;
    Py_XDECREF(ctx->owner);
  }
  delete ctx;
}
// A capsule that no consumer took (the consumer renames it "used_dltensor") frees its tensor itself.
void capsule_destructor(PyObject* cap) {
  const char* name = PyCapsule_GetName(cap);
  if (name == nullptr || std::strcmp(name, "dltensor") != 0) {
    PyErr_Clear();
    return;
  }
  auto* mt = static_cast<Managed*>(PyCapsule_GetPointer(cap, "dltensor"));
  if (mt != nullptr) mt->deleter(mt);
}
}  // namespace dlpack

void bind_transport(py::module_& m) {
  m.def(
      "_dlpack_bytes",
      [](uintptr_t ptr, int64_t nbytes, int device, py::object owner) {
        auto* ctx = new dlpack::Context();
        ctx->shape[0] = nbytes;
        ctx->owner = owner.inc_ref().ptr();
        dlpack::Tensor& t = ctx->managed.dl_tensor;
        t.data = reinterpret_cast<void*>(ptr);
        t.device = {2, device};
        t.ndim = 1;
        t.dtype = {1, 8, 1};
        t.shape = ctx->shape;
        t.strides = nullptr;
        t.byte_offset = 0;
        ctx->managed.manager_ctx = ctx;
        ctx->managed.deleter = dlpack::delete_managed;
        // A capsule never consumed (renamed "used_dltensor" by the consumer) frees its tensor itself.
        return py::capsule(&ctx->managed, "dltensor", &dlpack::capsule_destructor);
      },
      py::arg("ptr"), py::arg("nbytes"), py::arg("device"), py::arg("owner"),
      "A DLPack capsule of `nbytes` uint8 at device address `ptr` on CUDA device `device`, holding `owner` alive "
      "until the consumer's tensor is freed (tandem.transport peer views).");
  py::enum_<tandem::HeapKind>(m, "HeapKind")
      .value("AUTO", tandem::HeapKind::kAuto)
      .value("VMM", tandem::HeapKind::kVmm)
      .value("IPC", tandem::HeapKind::kIpc);

  py::class_<tandem::RangeAllocator>(m, "RangeAllocator", "The symmetric heap's offset allocator (host logic).")
      .def(py::init<uint64_t, uint64_t>(), py::arg("begin"), py::arg("end"))
      .def("allocate", &tandem::RangeAllocator::allocate, py::arg("bytes"), py::arg("align"))
      .def("release", &tandem::RangeAllocator::release, py::arg("offset"))
      .def_property_readonly("bytes_in_use", &tandem::RangeAllocator::bytes_in_use)
      .def_property_readonly("capacity", &tandem::RangeAllocator::capacity)
      .def_property_readonly("live_allocations", &tandem::RangeAllocator::live_allocations)
      .def_property_readonly("largest_free", &tandem::RangeAllocator::largest_free);

  m.def(
      "file_bootstrap_roundtrip",
      [](const std::string& dir, int rank, int world, const std::string& value) {
        tandem::FileBootstrap b(dir, rank, world, std::chrono::seconds(30));
        return b.all_gather("roundtrip", value);
      },
      py::arg("directory"), py::arg("rank"), py::arg("world"), py::arg("value"),
      py::call_guard<py::gil_scoped_release>(),
      "All-gather `value` over a FileBootstrap (used by tests of the C++ bootstrap).");

  // The node-local peer monitor on its own, over a FileBootstrap: lets CPU tests kill processes and watch.
  struct MonitorForTest {
    std::unique_ptr<tandem::FileBootstrap> boot;
    std::unique_ptr<tandem::detail::PeerMonitor> mon;
  };
  py::class_<MonitorForTest>(m, "_PeerMonitorForTest")
      .def(py::init([](const std::string& dir, int rank, int world, double timeout_s) {
             auto t = std::make_unique<MonitorForTest>();
             t->boot = std::make_unique<tandem::FileBootstrap>(dir, rank, world, std::chrono::seconds(60));
             std::vector<int> ranks(world);
             for (int r = 0; r < world; ++r) ranks[r] = r;
             const std::string secret = tandem::job_secret(*t->boot, "monitor");
             t->mon = std::make_unique<tandem::detail::PeerMonitor>(
                 *t->boot, "monitor", rank, ranks, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)),
                 nullptr, secret);
             return t;
           }),
           py::arg("directory"), py::arg("rank"), py::arg("world"), py::arg("timeout_s"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("exited_peer", [](const MonitorForTest& t) { return t.mon->exited_peer(); })
      .def_property_readonly("accepted", [](const MonitorForTest& t) { return t.mon->accepted(); })
      .def_property_readonly("refused", [](const MonitorForTest& t) { return t.mon->refused(); })
      .def("close", [](MonitorForTest& t) { t.mon.reset(); });

  m.def("_routable_ipv4", [] {
    std::string why;
    std::string addr = tandem::proxy::routable_ipv4(&why);
    return std::make_pair(addr, why);
  }, "(address, why): what the proxy listens on when the job spans hosts and no address was given.");
  // The heap's fd exchange on its own, over a FileBootstrap (key prefix "fdx"), with a memfd holding `payload`
  // in place of the cuMem fd: returns ({peer: payload read through the fd received from peer}, refused).
  m.def(
      "_fd_exchange_for_test",
      [](const std::string& dir, int rank, int world, double timeout_s, const std::string& payload) {
        tandem::FileBootstrap boot(dir, rank, world, std::chrono::seconds(60));
        std::vector<int> ranks(world);
        for (int r = 0; r < world; ++r) ranks[r] = r;
        const std::string secret = tandem::job_secret(boot, "fdx");
        const int mine = ::memfd_create("tandem-fdx-test", MFD_CLOEXEC);
        if (mine < 0 || ::pwrite(mine, payload.data(), payload.size(), 0) != static_cast<ssize_t>(payload.size()))
          throw tandem::Error(tandem::Status::kSystemError, "fd_exchange.test", rank, -1, "memfd");
        std::map<int, std::string> got;
        int refused = 0;
        try {
          const std::string session = tandem::detail::node_session(boot, "fdx", rank, ranks);
          tandem::detail::FdExchange ex(session, rank, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
          boot.set("fdx/listening/" + std::to_string(rank), tandem::detail::local_identity());
          std::map<int, std::string> ids;
          for (int r : ranks) ids[r] = boot.get("fdx/listening/" + std::to_string(r));
          const auto fds = ex.run(ranks, mine, secret, ids);
          refused = ex.refused();
          for (const auto& [peer, fd] : fds) {
            std::string buf(4096, '\0');
            const ssize_t n = ::pread(fd, buf.data(), buf.size(), 0);
            ::close(fd);
            got[peer] = buf.substr(0, n > 0 ? static_cast<size_t>(n) : 0);
          }
        } catch (...) {
          ::close(mine);
          throw;
        }
        ::close(mine);
        return std::make_pair(got, refused);
      },
      py::arg("directory"), py::arg("rank"), py::arg("world"), py::arg("timeout_s"), py::arg("payload"),
      py::call_guard<py::gil_scoped_release>());

  py::class_<tandem::Communicator, std::shared_ptr<tandem::Communicator>>(m, "Communicator")
      .def(py::init([](py::object store, int rank, int world, uint64_t heap_bytes, double timeout_s, int device,
                       tandem::HeapKind heap, int ranks_per_node, uint32_t proxy_capacity,
                       const std::string& proxy_host, bool external_proxy) {
             tandem::CommOptions o;
             o.external_proxy = external_proxy;
             o.proxy_capacity = proxy_capacity;
             o.proxy_host = proxy_host;
             o.heap_bytes = heap_bytes;
             o.timeout_s = timeout_s;
             o.device = device;
             o.heap = heap;
             o.ranks_per_node = ranks_per_node;
             auto b = std::make_shared<PyStoreBootstrap>(std::move(store), rank, world);
             return std::make_shared<tandem::Communicator>(std::move(b), o);
           }),
           py::arg("store"), py::arg("rank"), py::arg("world"), py::arg("heap_bytes"), py::arg("timeout_s"),
           py::arg("device"), py::arg("heap"), py::arg("ranks_per_node"), py::arg("proxy_capacity") = 4096,
           py::arg("proxy_host") = "", py::arg("external_proxy") = false)
      .def_property_readonly("rank", &tandem::Communicator::rank)
      .def_property_readonly("world", &tandem::Communicator::world)
      .def_property_readonly("node", &tandem::Communicator::node)
      .def_property_readonly("num_nodes", &tandem::Communicator::num_nodes)
      .def_property_readonly("local_ranks", &tandem::Communicator::local_ranks)
      .def_property_readonly("uniform_ranks_per_node", &tandem::Communicator::uniform_ranks_per_node,
                             "L if nodes are groups of L consecutive ranks, else 0")
      .def_property_readonly("local_rank", &tandem::Communicator::local_rank)
      .def_property_readonly("device", &tandem::Communicator::device)
      .def_property_readonly("sm_count", &tandem::Communicator::sm_count)
      .def_property_readonly("ranks_on_device", [](const tandem::Communicator& c) {
            int n = 1;
            for (int p = 0; p < c.world(); ++p) n += p != c.rank() && c.peer_on_same_device(p);
            return n;
          }, "ranks of this communicator on this process's GPU, itself included (MPS sharing: > 1)")
      .def_property_readonly("heap_kind", [](const tandem::Communicator& c) { return std::string(c.heap_kind()); })
      .def_property_readonly("heap_base", [](const tandem::Communicator& c) {
        return reinterpret_cast<uintptr_t>(c.heap_base());
      })
      .def_property_readonly("heap_bytes", &tandem::Communicator::heap_bytes)
      .def_property_readonly("heap_bytes_in_use", &tandem::Communicator::heap_bytes_in_use)
      .def_property_readonly("timeout_s", [](const tandem::Communicator& c) { return c.options().timeout_s; })
      .def(
          "alloc",
          [](tandem::Communicator& c, uint64_t bytes, uint64_t align, bool verify) {
            return reinterpret_cast<uintptr_t>(c.alloc(bytes, align, verify));
          },
          py::arg("bytes"), py::arg("align") = 256, py::arg("verify") = true)
      .def(
          "free", [](tandem::Communicator& c, uintptr_t p) { c.free(reinterpret_cast<void*>(p)); }, py::arg("ptr"))
      .def(
          "peer_ptr",
          [](const tandem::Communicator& c, uintptr_t sym, int peer) {
            return reinterpret_cast<uintptr_t>(c.peer_ptr(reinterpret_cast<const void*>(sym), peer));
          },
          py::arg("sym"), py::arg("peer"))
      .def("abort", &tandem::Communicator::abort)
      .def_property_readonly("aborted", &tandem::Communicator::aborted)
      .def("async_error",
           [](const tandem::Communicator& c) -> py::object {
             auto e = c.async_error();
             if (!e) return py::none();
             py::dict d;
             d["status"] = static_cast<int>(e->status);
             d["status_name"] = std::string(tandem::status_name(e->status));
             d["op"] = std::string(tandem::device_op_name(e->op));
             d["rank"] = e->rank;
             d["peer"] = e->peer;
             d["expected"] = e->expected;
             d["observed"] = e->observed;
             d["elapsed_ns"] = e->elapsed_ns;
             d["message"] = e->message();
             return d;
           })
      .def("check", &tandem::Communicator::check)
      .def(
          "error_info",
          [](const tandem::Communicator& c) -> py::object {
            // check() as data, without C++ unwinding: Python raises TandemError itself.
            const auto e = c.first_error();
            if (!e) return py::none();
            py::dict d;
            d["message"] = e->message;
            d["status"] = static_cast<int>(e->status);
            d["op"] = e->op;
            d["rank"] = e->rank;
            d["peer"] = e->peer;
            return d;
          },
          "None, or the error check() would raise, as a dict (message, status, op, rank, peer).")
      .def_property_readonly("exited_peer", &tandem::Communicator::exited_peer)
      .def_property_readonly("has_proxy", &tandem::Communicator::has_proxy)
      .def_property_readonly(
          "command_queue", [](const tandem::Communicator& c) { return c.command_queue(); },
          py::return_value_policy::reference_internal,
          "The proxy command queue (None without proxy peers); drained by the caller with external_proxy.")
      .def(
          "export_heap_dmabuf",
          [](const tandem::Communicator& c) -> py::object {
            std::string why;
            const int fd = c.export_heap_dmabuf(&why);
            if (fd < 0) return py::str(why);
            return py::int_(fd);
          },
          "A dmabuf fd over this rank's heap (int, caller closes it), or the reason there is none (str).")
      .def_property_readonly("proxy_backend",
                             [](const tandem::Communicator& c) { return std::string(c.proxy_backend()); })
      .def("host_barrier", &tandem::Communicator::host_barrier)
      .def("destroy", &tandem::Communicator::destroy, py::call_guard<py::gil_scoped_release>());
}

}  // namespace tandem_py

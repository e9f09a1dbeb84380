// torch.ops.tandem.gemm and torch.ops.tandem.scaled_gemm as C++ kernels of torch's CUDA dispatch key.
//
// Why this library exists: the ops are defined in Python (tandem/ops/_runtime.py, define_op) with a Python
// implementation. A call through torch's dispatcher into Python costs more host time than the kernels' launch
// (about 3 us of dispatch, 11 us of Python on an H100 host, measured by tools/diag/gemm_host_path.py), which a
// single-launch timing against cuBLAS counts in full. Here a call that has been seen before (same shapes, strides,
// dtypes, devices) runs without Python: a cache lookup, the output's allocation, and the launch through tandem._C's
// launch table (launch_table.h). A call not seen before goes to Python once (with the GIL), which runs the full
// input checks, chooses the configuration and tile schedule (tandem.ops.gemm_plan) and returns the prepared Args;
// bad input raises there, as a TandemError, before anything is launched.
//
// It is built against torch's headers (python/CMakeLists.txt, where torch is importable at build time; or
// tools/build_torch_ops.sh) and registers nothing until Python installs it (tandem/ops/_dispatcher.py): it must not
// run with a tandem._C of another layout, so install() checks the launch table's version and Args sizes.
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>
#include <torch/version.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "tandem/kernels/gemm/launch_table.h"

namespace {

namespace g = tandem::kernels::gemm;

// ---- what Python hands over at install ----------------------------------------------------------------------------
struct Hooks {
  const g::GemmLaunchTable* table = nullptr;
  PyObject* plan_gemm = nullptr;     // (a, b) -> (Args bytes, workspace bytes, configuration name or "")
  PyObject* plan_scaled = nullptr;   // (a, b, scale_a, scale_b) -> (Args bytes, workspace bytes)
  PyObject* launch_error = nullptr;  // (status, op, reason) -> the TandemError to raise
};
Hooks g_hooks;  // written once under the GIL, before the kernels are registered
std::unique_ptr<torch::Library> g_library;  // the CUDA-key registrations; reset to remove them

// ---- the prepared-call cache: a call signature -> the Args the planner made for it ----------------------------------
// A signature is every property of the inputs the plan depends on: per tensor its dims, sizes, strides, dtype and
// device. Tensors of more than two dims never get here (the planner rejects them); addresses are not part of it
// (each call's go on a copy of the Args), but their 16-byte alignment is checked every call.
struct Signature {
  std::array<int64_t, 40> v{};
  int n = 0;
  bool add(const at::Tensor& t) {
    const int64_t dims = t.dim();
    if (dims > 2 || n + 3 + 2 * dims + 2 > static_cast<int>(v.size())) return false;
    v[n++] = dims;
    for (int64_t i = 0; i < dims; ++i) v[n++] = t.size(i);
    for (int64_t i = 0; i < dims; ++i) v[n++] = t.stride(i);
    v[n++] = static_cast<int64_t>(t.scalar_type());
    v[n++] = static_cast<int64_t>(t.device().type());
    v[n++] = t.device().index();
    return true;
  }
  bool operator==(const Signature& o) const {
    return n == o.n && std::memcmp(v.data(), o.v.data(), sizeof(int64_t) * n) == 0;
  }
};
struct SignatureHash {
  size_t operator()(const Signature& s) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the values
    for (int i = 0; i < s.n; ++i) {
      h ^= static_cast<uint64_t>(s.v[i]);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

template <class Entry>
class PreparedCache {
 public:
  bool find(const Signature& s, Entry* out) const {
    std::shared_lock lock(mu_);
    auto it = map_.find(s);
    if (it == map_.end()) return false;
    *out = it->second;
    return true;
  }
  void put(const Signature& s, const Entry& e) {
    std::unique_lock lock(mu_);
    if (map_.size() >= kLimit) map_.clear();  // as tandem.ops._runtime's PREPARED_LIMIT: shapes that never repeat
    map_[s] = e;
  }
  void clear() {
    std::unique_lock lock(mu_);
    map_.clear();
  }

 private:
  static constexpr size_t kLimit = 4096;
  mutable std::shared_mutex mu_;
  std::unordered_map<Signature, Entry, SignatureHash> map_;
};

struct GemmEntry {
  g::GemmArgs args;
  size_t workspace_bytes = 0;
  const char* variant = nullptr;  // nullptr = the core (gemm::run), else a named configuration (variants::run),
                                  // interned: a cache hit copies no string
};

// The configuration names the planner returns, kept for the process's life (a few dozen at most).
const char* intern(const char* name) {
  static std::mutex mu;
  static auto* names = new std::unordered_map<std::string, std::unique_ptr<std::string>>();
  std::lock_guard lock(mu);
  auto& slot = (*names)[name];
  if (!slot) slot = std::make_unique<std::string>(name);
  return slot->c_str();
}
struct ScaledEntry {
  g::ScaledGemmArgs args;
  size_t workspace_bytes = 0;
};
// Allocated once and never destroyed: a call on another thread during exit must not find a destroyed map (static
// destruction would run before g_library removes the registrations).
PreparedCache<GemmEntry>& g_gemm_cache = *new PreparedCache<GemmEntry>();
PreparedCache<ScaledEntry>& g_scaled_cache = *new PreparedCache<ScaledEntry>();

// ---- Python, on a miss or a failure -------------------------------------------------------------------------------
bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

struct Gil {  // the calling thread may or may not hold the GIL (torch's Python bindings release it around ops)
  PyGILState_STATE s;
  Gil() {
    // a miss after the interpreter has gone (a C++ thread at exit) has no planner to ask
    TORCH_CHECK(Py_IsInitialized() && !python_finalizing(),
                "tandem: gemm: a call signature not seen before needs the Python planner, and Python has exited");
    s = PyGILState_Ensure();
  }
  ~Gil() { PyGILState_Release(s); }
};

// The Python error that is set now, thrown so that torch's Python bindings restore it as it was (a TandemError stays
// a TandemError); its message is kept for C++ callers.
[[noreturn]] void throw_python_error() {
  python_error e;  // torch/csrc/Exceptions.h (global namespace)
  e.persist();
  throw e;
}

struct Ref {  // an owned reference, released on every path out
  PyObject* p;
  explicit Ref(PyObject* o) : p(o) {}
  ~Ref() { Py_XDECREF(p); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
};

// Call a planner with the tensors; returns its result tuple (new reference) or throws its exception.
PyObject* call_planner(PyObject* fn, std::initializer_list<const at::Tensor*> tensors) {
  Ref args(PyTuple_New(static_cast<Py_ssize_t>(tensors.size())));
  if (!args.p) throw_python_error();
  Py_ssize_t i = 0;
  for (const at::Tensor* t : tensors) {
    PyObject* o = THPVariable_Wrap(*t);
    if (!o) throw_python_error();
    PyTuple_SET_ITEM(args.p, i++, o);  // steals o
  }
  PyObject* r = PyObject_CallObject(fn, args.p);
  if (!r) throw_python_error();
  return r;
}

// Copy the Args bytes of a planner's result item into `out`, checking the size this library was built with.
template <class Args>
void args_from_bytes(PyObject* bytes, Args* out, const char* op) {
  char* data = nullptr;
  Py_ssize_t len = 0;
  if (PyBytes_AsStringAndSize(bytes, &data, &len) != 0) throw_python_error();
  if (len != static_cast<Py_ssize_t>(sizeof(Args))) {
    PyErr_Format(PyExc_RuntimeError, "tandem: %s: the planner's Args are %zd bytes, this library's %zu (a "
                 "libtandem_torch_ops built against another tandem._C)", op, len, sizeof(Args));
    throw_python_error();
  }
  std::memcpy(static_cast<void*>(out), data, sizeof(Args));
}

GemmEntry plan_gemm(const at::Tensor& a, const at::Tensor& b) {
  Gil gil;
  Ref r(call_planner(g_hooks.plan_gemm, {&a, &b}));
  PyObject *bytes = nullptr, *variant = nullptr;
  unsigned long long ws = 0;
  if (!PyArg_ParseTuple(r.p, "SKU", &bytes, &ws, &variant)) throw_python_error();
  GemmEntry e;
  args_from_bytes(bytes, &e.args, "gemm");
  e.workspace_bytes = static_cast<size_t>(ws);
  const char* name = PyUnicode_AsUTF8(variant);
  if (!name) throw_python_error();
  e.variant = *name ? intern(name) : nullptr;
  return e;
}

ScaledEntry plan_scaled(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb) {
  Gil gil;
  Ref r(call_planner(g_hooks.plan_scaled, {&a, &b, &sa, &sb}));
  PyObject* bytes = nullptr;
  unsigned long long ws = 0;
  if (!PyArg_ParseTuple(r.p, "SK", &bytes, &ws)) throw_python_error();
  ScaledEntry e;
  args_from_bytes(bytes, &e.args, "scaled_gemm");
  e.workspace_bytes = static_cast<size_t>(ws);
  return e;
}

// A launcher's non-OK status as tandem's TandemError (tandem.errors.launch_error builds it).
[[noreturn]] void raise_launch_error(int32_t status, const char* op, const char* why) {
  Gil gil;
  // the reason may end inside a multi-byte character (cut at the buffer's size) or not be UTF-8 at all
  PyObject* reason = PyUnicode_DecodeUTF8(why, static_cast<Py_ssize_t>(std::strlen(why)), "replace");
  if (!reason) throw_python_error();
  Ref exc(PyObject_CallFunction(g_hooks.launch_error, "isN", static_cast<int>(status), op, reason));
  if (!exc.p) throw_python_error();
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.p)), exc.p);
  throw_python_error();
}

// torch's current stream on `device`, through c10's device-guard interface (no link to c10_cuda: this library
// builds against a CPU-only torch too, and finds CUDA's implementation at run time).
cudaStream_t current_stream(const c10::Device& device) {
  static const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return static_cast<cudaStream_t>(impl->getStreamNativeHandle(impl->getStream(device)));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

at::Tensor workspace_for(size_t bytes, const at::Tensor& like) {
  return bytes ? at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte)) : at::Tensor();
}

// ---- the kernels ----------------------------------------------------------------------------------------------------
at::Tensor gemm_cuda(const at::Tensor& a, const at::Tensor& b) {
  // a's device current from here on: the planner sizes grids and workspaces for the current device
  c10::DeviceGuard guard(a.device());
  Signature s;
  GemmEntry e;
  const bool keyed = s.add(a) && s.add(b);
  // a signature not seen, or addresses the planner has not checked: the full path (raises on bad input)
  if (!keyed || !aligned16(a.const_data_ptr()) || !aligned16(b.const_data_ptr()) || !g_gemm_cache.find(s, &e)) {
    e = plan_gemm(a, b);
    if (keyed) g_gemm_cache.put(s, e);
  }
  at::Tensor d = at::empty({a.size(0), b.size(1)}, a.options());
  at::Tensor ws = workspace_for(e.workspace_bytes, a);
  void* ws_ptr = ws.defined() ? ws.data_ptr() : nullptr;
  char why[512] = {0};
  const cudaStream_t stream = current_stream(a.device());
  const int32_t status =
      e.variant == nullptr
          ? g_hooks.table->gemm(&e.args, a.const_data_ptr(), b.const_data_ptr(), d.data_ptr(), ws_ptr, stream, why,
                                sizeof(why))
          : g_hooks.table->gemm_variant(e.variant, &e.args, a.const_data_ptr(), b.const_data_ptr(), d.data_ptr(),
                                        ws_ptr, stream, why, sizeof(why));
  if (status != 0) raise_launch_error(status, "gemm", why);
  return d;
}

at::Tensor scaled_gemm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                            const at::Tensor& scale_b) {
  c10::DeviceGuard guard(a.device());  // as gemm_cuda's: before the planner
  Signature s;
  ScaledEntry e;
  const bool keyed = s.add(a) && s.add(b) && s.add(scale_a) && s.add(scale_b);
  if (!keyed || !aligned16(a.const_data_ptr()) || !aligned16(b.const_data_ptr()) ||
      !aligned16(scale_a.const_data_ptr()) || !aligned16(scale_b.const_data_ptr()) || !g_scaled_cache.find(s, &e)) {
    e = plan_scaled(a, b, scale_a, scale_b);
    if (keyed) g_scaled_cache.put(s, e);
  }
  at::Tensor d = at::empty({a.size(0), b.size(1)}, a.options().dtype(at::kBFloat16));
  at::Tensor ws = workspace_for(e.workspace_bytes, a);
  char why[512] = {0};
  const int32_t status = g_hooks.table->scaled_gemm(
      &e.args, a.const_data_ptr(), b.const_data_ptr(), d.data_ptr(), scale_a.const_data_ptr<float>(),
      scale_b.const_data_ptr<float>(), ws.defined() ? ws.data_ptr() : nullptr, current_stream(a.device()), why,
      sizeof(why));
  if (status != 0) raise_launch_error(status, "scaled_gemm", why);
  return d;
}

// Register the CUDA-key kernels (kept in g_library). 0, or -1 with a Python error set.
int register_kernels() {
  try {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "tandem", c10::DispatchKey::CUDA, __FILE__,
                                                __LINE__);
    lib->impl("gemm", &gemm_cuda);
    lib->impl("scaled_gemm", &scaled_gemm_cuda);
    g_library = std::move(lib);
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "tandem: registering the CUDA kernels of tandem::gemm / scaled_gemm: %s",
                 e.what());
    return -1;
  }
  return 0;
}

#define TANDEM_STR2(x) #x
#define TANDEM_STR(x) TANDEM_STR2(x)

}  // namespace

extern "C" {

// The torch version this library was compiled against ("2.11.0"): Python loads it only into that torch.
__attribute__((visibility("default"))) const char* tandem_torch_ops_torch_version() {
  return TANDEM_STR(TORCH_VERSION_MAJOR) "." TANDEM_STR(TORCH_VERSION_MINOR) "." TANDEM_STR(TORCH_VERSION_PATCH);
}

// Called once by tandem.ops._dispatcher with the GIL held (ctypes.PyDLL): checks tandem._C's launch table against
// this library's Args, keeps the hooks, and registers the CUDA kernels. 0 on success; -1 with a Python error set.
__attribute__((visibility("default"))) int tandem_torch_ops_install(PyObject* table_capsule, PyObject* plan_gemm,
                                                                    PyObject* plan_scaled, PyObject* launch_error) {
  if (g_hooks.table) return g_library ? 0 : register_kernels();  // installed before (perhaps switched off)
  auto* table = static_cast<const g::GemmLaunchTable*>(PyCapsule_GetPointer(table_capsule, g::kGemmLaunchTableName));
  if (!table) return -1;
  if (table->version != g::kGemmLaunchTableVersion || table->gemm_args_bytes != sizeof(g::GemmArgs) ||
      table->scaled_gemm_args_bytes != sizeof(g::ScaledGemmArgs)) {
    PyErr_Format(PyExc_RuntimeError,
                 "tandem: libtandem_torch_ops (launch table v%u, Args %zu / %zu bytes) does not match tandem._C "
                 "(v%u, %u / %u): rebuild one against the other",
                 g::kGemmLaunchTableVersion, sizeof(g::GemmArgs), sizeof(g::ScaledGemmArgs), table->version,
                 table->gemm_args_bytes, table->scaled_gemm_args_bytes);
    return -1;
  }
  if (!PyCallable_Check(plan_gemm) || !PyCallable_Check(plan_scaled) || !PyCallable_Check(launch_error)) {
    PyErr_SetString(PyExc_TypeError, "tandem_torch_ops_install: the planners and the error factory must be callable");
    return -1;
  }
  Py_INCREF(plan_gemm);  // kept for the process's life, as the ops are
  Py_INCREF(plan_scaled);
  Py_INCREF(launch_error);
  g_hooks = Hooks{table, plan_gemm, plan_scaled, launch_error};
  return register_kernels();
}

// Remove (enabled 0) or restore (1) the CUDA-key kernels: the ops then run their Python implementation, which the
// benchmark times beside this one. Requires a previous install. Returns 0, or -1 with a Python error set. Not while
// another thread calls the ops: torch's dispatcher does not take a registration beside a running call of that op.
__attribute__((visibility("default"))) int tandem_torch_ops_set_enabled(int enabled) {
  if (!g_hooks.table) {
    PyErr_SetString(PyExc_RuntimeError, "tandem_torch_ops_set_enabled before install");
    return -1;
  }
  if (!enabled) {
    g_library.reset();  // its destructor removes the registrations
    return 0;
  }
  return g_library ? 0 : register_kernels();
}

// Forget every prepared call (tandem.ops._runtime.release_workspaces: a tuned table rewritten since then applies to
// the signatures called next, as for the Python path's prepared calls).
__attribute__((visibility("default"))) void tandem_torch_ops_clear_cache() {
  g_gemm_cache.clear();
  g_scaled_cache.clear();
}

}  // extern "C"

// tandem._C — Python bindings. This directory is the only place pybind11 appears; no torch headers anywhere.
#include <pybind11/pybind11.h>

#include "common.h"
#include "tandem/transport/status.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "tandem native module: transport (communicator, symmetric heap) and kernel launchers";
  py::enum_<tandem::Status>(m, "Status")
      .value("OK", tandem::Status::kOk)
      .value("TIMEOUT", tandem::Status::kTimeout)
      .value("ABORTED", tandem::Status::kAborted)
      .value("INVALID_ARGUMENT", tandem::Status::kInvalidArgument)
      .value("UNREACHABLE_PEER", tandem::Status::kUnreachablePeer)
      .value("CUDA_ERROR", tandem::Status::kCudaError)
      .value("SYSTEM_ERROR", tandem::Status::kSystemError)
      .value("BOOTSTRAP_ERROR", tandem::Status::kBootstrapError)
      .value("OUT_OF_MEMORY", tandem::Status::kOutOfMemory)
      .value("UNSUPPORTED", tandem::Status::kUnsupported)
      .value("INTERNAL", tandem::Status::kInternal)
      .value("PEER_EXITED", tandem::Status::kPeerExited);
  m.attr("cuda_architectures") = TANDEM_CUDA_ARCHITECTURES;  // CMAKE_CUDA_ARCHITECTURES of this build
  m.def("status_name", [](int s) { return std::string(tandem::status_name(static_cast<tandem::Status>(s))); });

  // tandem::Error -> tandem.errors.TandemError(message, status, op, rank, peer)
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tandem::Error& e) {
      tandem_py::raise_tandem_error(e);
    }
  });
  m.def(
      "_raise_error_for_test",
      [](int status, const std::string& op, int rank, int peer) {
        throw tandem::Error(static_cast<tandem::Status>(status), op, rank, peer, "raised for a test");
      },
      "Throw tandem::Error through the exception translator (tests the C++ -> Python error mapping).");
  tandem_py::bind_transport(m);
  tandem_py::bind_probe(m);
  tandem_py::bind_proxy(m);
  tandem_py::bind_verbs(m);
  tandem_py::bind_kernels(m);
}

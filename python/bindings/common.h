#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "tandem/transport/status.h"

namespace tandem_py {

namespace py = pybind11;

void bind_transport(py::module_& m);
void bind_probe(py::module_& m);
void bind_proxy(py::module_& m);
void bind_verbs(py::module_& m);
void bind_kernels(py::module_& m);

// Set the Python error to tandem.errors.TandemError built from `e` (called inside an exception translator).
void raise_tandem_error(const tandem::Error& e);

// Throw tandem::Error for a non-OK status returned by a launcher.
void check_launch(tandem::Status s, const char* op, int rank);

// A proxy command's fields from their Python names (proxy.cc: the command ring and the verbs planner take the same
// names): op "put" / "put_signal" / "signal", signal_op "set" / "add". Anything else throws tandem::Error
// (INVALID_ARGUMENT) naming `where` and the peer.
uint32_t command_op_code(const std::string& op, const char* where, int peer);
uint32_t signal_op_code(const std::string& signal_op, const char* where, int peer);

}  // namespace tandem_py

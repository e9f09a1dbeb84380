#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

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

}  // namespace tandem_py

// Diagnostic: the smallest pybind11 module that throws a C++ exception through the binding layer.
#include <pybind11/pybind11.h>
#include <stdexcept>
PYBIND11_MODULE(throw_probe, m) {
  m.def("throw_runtime", [] { throw std::runtime_error("thrown in C++"); });
  m.def("throw_caught", [] {
    try {
      throw std::runtime_error("x");
    } catch (const std::exception&) {
      return 1;
    }
    return 0;
  });
}

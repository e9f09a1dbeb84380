# FindCUTLASS — the CUTLASS/CuTe headers (header-only) for tandem's Hopper GEMM core.
#
# Looks, in order, at:
#   1. TANDEM_CUTLASS_DIR (cache variable or environment variable): a CUTLASS source folder, the one holding
#      include/cutlass/cutlass.h and tools/util/include/;
#   2. the PyPI wheel nvidia-cutlass (cutlass_library/source) of the build's Python (Python_EXECUTABLE, which
#      scikit-build-core sets: with build isolation that is the isolated build environment, where
#      [build-system].requires installs the wheel). The package folder is located without importing it
#      (importlib.util.find_spec, then importlib.metadata), so its Python dependencies need not import.
#
# Sets CUTLASS_FOUND, CUTLASS_SOURCE_DIR (the source folder), CUTLASS_INCLUDE_DIRS, CUTLASS_VERSION and the
# imported target CUTLASS::headers.
set(TANDEM_CUTLASS_DIR "$ENV{TANDEM_CUTLASS_DIR}" CACHE PATH "CUTLASS source folder (include/, tools/util/include/)")

set(_cutlass_dir "")
if(TANDEM_CUTLASS_DIR AND EXISTS "${TANDEM_CUTLASS_DIR}/include/cutlass/cutlass.h")
  set(_cutlass_dir "${TANDEM_CUTLASS_DIR}")
else()
  if(TANDEM_CUTLASS_DIR)
    message(WARNING "TANDEM_CUTLASS_DIR=${TANDEM_CUTLASS_DIR} has no include/cutlass/cutlass.h; looking for the nvidia-cutlass wheel")
  endif()
  if(NOT Python_EXECUTABLE)
    find_package(Python 3.8 COMPONENTS Interpreter QUIET)
  endif()
  if(Python_EXECUTABLE)
    set(_cutlass_py [=[
import importlib.util, os, sys
d = None
try:
    s = importlib.util.find_spec("cutlass_library")
    if s is not None and s.submodule_search_locations:
        d = os.path.join(list(s.submodule_search_locations)[0], "source")
except Exception:
    pass
if d is None or not os.path.isfile(os.path.join(d, "include", "cutlass", "cutlass.h")):
    try:
        import importlib.metadata as md
        d = str(md.distribution("nvidia-cutlass").locate_file("cutlass_library/source"))
    except Exception:
        sys.exit(1)
print(d)
]=])
    execute_process(COMMAND "${Python_EXECUTABLE}" -c "${_cutlass_py}"
                    OUTPUT_VARIABLE _cutlass_out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _cutlass_rc)
    if(_cutlass_rc EQUAL 0)
      file(TO_CMAKE_PATH "${_cutlass_out}" _cutlass_dir)
    endif()
  endif()
endif()

unset(CUTLASS_VERSION)
if(_cutlass_dir AND EXISTS "${_cutlass_dir}/include/cutlass/cutlass.h")
  set(CUTLASS_SOURCE_DIR "${_cutlass_dir}")
  set(CUTLASS_INCLUDE_DIRS "${_cutlass_dir}/include" "${_cutlass_dir}/tools/util/include")
  if(EXISTS "${_cutlass_dir}/include/cutlass/version.h")
    file(STRINGS "${_cutlass_dir}/include/cutlass/version.h" _cutlass_v REGEX "^#define CUTLASS_(MAJOR|MINOR|PATCH) [0-9]+")
    foreach(_part MAJOR MINOR PATCH)
      string(REGEX REPLACE ".*#define CUTLASS_${_part} ([0-9]+).*" "\\1" _cutlass_${_part} "${_cutlass_v}")
    endforeach()
    set(CUTLASS_VERSION "${_cutlass_MAJOR}.${_cutlass_MINOR}.${_cutlass_PATCH}")
  endif()
else()
  set(CUTLASS_SOURCE_DIR "CUTLASS_SOURCE_DIR-NOTFOUND")
endif()

string(CONCAT _cutlass_hint
  "CUTLASS headers not found. `pip install .` installs the nvidia-cutlass wheel into its isolated build "
  "environment. With --no-build-isolation run `pip install --no-deps nvidia-cutlass==4.2.0.0` first, or set "
  "-DTANDEM_CUTLASS_DIR=<cutlass source folder> (or the environment variable TANDEM_CUTLASS_DIR)")
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUTLASS
  REQUIRED_VARS CUTLASS_SOURCE_DIR
  VERSION_VAR CUTLASS_VERSION
  FAIL_MESSAGE "${_cutlass_hint}")

if(CUTLASS_FOUND AND NOT TARGET CUTLASS::headers)
  add_library(CUTLASS::headers INTERFACE IMPORTED)
  set_target_properties(CUTLASS::headers PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${CUTLASS_INCLUDE_DIRS}")
endif()

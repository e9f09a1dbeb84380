// The CUDA driver functions CUTLASS/CuTe call on the host (cuTensorMapEncodeTiled builds every TMA descriptor of
// every GEMM and attention launch; cuTensorMapEncodeIm2col, for convolutions, is here so that no use of it can
// leave the module with an undefined symbol), resolved once per process.
//
// Why: without CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL, CUTLASS's wrapper (cutlass/cuda_host_adapter.hpp) looks the
// function up by name with cudaGetDriverEntryPointByVersion on *every* call, i.e. for each of the two to five
// descriptors of every launch. With the macro set the wrapper calls the function by its plain name instead,
// normally a link against libcuda. tandem does not link libcuda (the module must import on machines without a
// driver, like every tandem library: transport/src/driver_api.cc), so kernels/CMakeLists.txt also renames the two
// functions for tandem_kernels' sources (cuTensorMapEncodeTiled=tandem_cuTensorMapEncodeTiled, cuda.h's declaration
// included), and they are defined here as forwarders to the driver's entry points, looked up once. So no object of
// the installed static library defines a symbol with the driver's own name (a consumer linking libcuda and
// tandem_kernels sees no clash, and its own calls go to the driver), and the forwarders are hidden besides.
#include <cuda.h>
#include <cuda_runtime_api.h>

namespace {

template <class Fn>
Fn resolve(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace

// (with the CMake renames these are tandem_cuTensorMapEncodeTiled / tandem_cuTensorMapEncodeIm2col; the strings
// passed to the entry-point lookup are the driver's names, which no macro touches)
extern "C" __attribute__((visibility("hidden"))) CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap* tensor_map, CUtensorMapDataType data_type, cuuint32_t rank, void* global_address,
    const cuuint64_t* global_dim, const cuuint64_t* global_strides, const cuuint32_t* box_dim,
    const cuuint32_t* element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2_promotion, CUtensorMapFloatOOBfill oob_fill) {
  // resolved on first use (thread-safe static initialization); a driver without the entry point (older than
  // CUDA 12) gets what CUTLASS's own wrapper returns then
  static const auto encode = resolve<decltype(&::cuTensorMapEncodeTiled)>("cuTensorMapEncodeTiled");
  if (encode == nullptr) return CUDA_ERROR_UNKNOWN;
  return encode(tensor_map, data_type, rank, global_address, global_dim, global_strides, box_dim, element_strides,
                interleave, swizzle, l2_promotion, oob_fill);
}

extern "C" __attribute__((visibility("hidden"))) CUresult CUDAAPI cuTensorMapEncodeIm2col(
    CUtensorMap* tensor_map, CUtensorMapDataType data_type, cuuint32_t rank, void* global_address,
    const cuuint64_t* global_dim, const cuuint64_t* global_strides, const int* pixel_box_lower_corner,
    const int* pixel_box_upper_corner, cuuint32_t channels_per_pixel, cuuint32_t pixels_per_column,
    const cuuint32_t* element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2_promotion, CUtensorMapFloatOOBfill oob_fill) {
  static const auto encode = resolve<decltype(&::cuTensorMapEncodeIm2col)>("cuTensorMapEncodeIm2col");
  if (encode == nullptr) return CUDA_ERROR_UNKNOWN;
  return encode(tensor_map, data_type, rank, global_address, global_dim, global_strides, pixel_box_lower_corner,
                pixel_box_upper_corner, channels_per_pixel, pixels_per_column, element_strides, interleave, swizzle,
                l2_promotion, oob_fill);
}

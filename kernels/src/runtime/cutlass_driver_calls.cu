// The CUDA driver functions CUTLASS/CuTe call on the host (today one: cuTensorMapEncodeTiled, which builds every
// TMA descriptor of every GEMM and attention launch), resolved once per process.
//
// Why: without CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL, CUTLASS's wrapper (cutlass/cuda_host_adapter.hpp) looks the
// function up by name with cudaGetDriverEntryPointByVersion on *every* call, i.e. for each of the two to five
// descriptors of every launch. With the macro set (kernels/CMakeLists.txt, for the sources that include CUTLASS)
// the wrapper calls the function by its plain name instead, normally a link against libcuda. tandem does not link
// libcuda (the module must import on machines without a driver, like every tandem library: transport/src/
// driver_api.cc), so the name is defined here: a forwarder to the entry point looked up once. It is hidden (not
// exported from the module or a consumer's binary) and does exactly what the driver's function does, so nothing
// else in the process can see or tell the difference.
#include <cuda.h>
#include <cuda_runtime_api.h>

namespace {

using EncodeTiled = decltype(&::cuTensorMapEncodeTiled);

EncodeTiled resolve_encode_tiled() {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<EncodeTiled>(p);
}

}  // namespace

extern "C" __attribute__((visibility("hidden"))) CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap* tensor_map, CUtensorMapDataType data_type, cuuint32_t rank, void* global_address,
    const cuuint64_t* global_dim, const cuuint64_t* global_strides, const cuuint32_t* box_dim,
    const cuuint32_t* element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2_promotion, CUtensorMapFloatOOBfill oob_fill) {
  // resolved on first use (thread-safe static initialization); a driver without the entry point (older than
  // CUDA 12) gets what CUTLASS's own wrapper returns then
  static const EncodeTiled encode = resolve_encode_tiled();
  if (encode == nullptr) return CUDA_ERROR_UNKNOWN;
  return encode(tensor_map, data_type, rank, global_address, global_dim, global_strides, box_dim, element_strides,
                interleave, swizzle, l2_promotion, oob_fill);
}

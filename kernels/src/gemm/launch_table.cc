// The GEMM launchers as a table of C function pointers (launch_table.h says who reads it and why).
#include "tandem/kernels/gemm/launch_table.h"

#include <cstring>
#include <string>

#include "tandem/kernels/gemm/gemm_variants.h"

namespace tandem::kernels::gemm {
namespace {

// A launcher's status as the table's int32, its reason copied (truncated) into the caller's buffer.
int32_t finish(Status s, const std::string& why, char* out, size_t out_len) {
  if (s != Status::kOk && out != nullptr && out_len > 0) {
    const size_t n = why.size() < out_len - 1 ? why.size() : out_len - 1;
    std::memcpy(out, why.data(), n);
    out[n] = '\0';
  }
  return static_cast<int32_t>(s);
}

int32_t launch_gemm(const GemmArgs* args, const void* a, const void* b, void* d, void* workspace, cudaStream_t stream,
                    char* why, size_t why_len) {
  GemmArgs x = *args;  // the prepared Args are shared: this call's addresses go on a copy
  x.a = a;
  x.b = b;
  x.d = d;
  std::string reason;
  return finish(run(x, workspace, stream, &reason), reason, why, why_len);
}

int32_t launch_gemm_variant(const char* name, const GemmArgs* args, const void* a, const void* b, void* d,
                            void* workspace, cudaStream_t stream, char* why, size_t why_len) {
  GemmArgs x = *args;
  x.a = a;
  x.b = b;
  x.d = d;
  std::string reason;
  const Status s = variants::run(name, x, stream, &reason, workspace);
  if (s == Status::kOk) return 0;  // the message only for a failure (a launch must not allocate for it)
  return finish(s, std::string(name) + ": " + (reason.empty() ? std::string("failed") : reason), why, why_len);
}

int32_t launch_scaled_gemm(const ScaledGemmArgs* args, const void* a, const void* b, void* d, const float* scale_a,
                           const float* scale_b, void* workspace, cudaStream_t stream, char* why, size_t why_len) {
  ScaledGemmArgs x = *args;
  x.a = a;
  x.b = b;
  x.d = d;
  x.scale_a = scale_a;
  x.scale_b = scale_b;
  std::string reason;
  return finish(run(x, workspace, stream, &reason), reason, why, why_len);
}

constexpr GemmLaunchTable kTable = {
    kGemmLaunchTableVersion, static_cast<uint32_t>(sizeof(GemmArgs)), static_cast<uint32_t>(sizeof(ScaledGemmArgs)),
    &launch_gemm,            &launch_gemm_variant,                    &launch_scaled_gemm,
};

}  // namespace

const GemmLaunchTable* gemm_launch_table() { return &kTable; }

}  // namespace tandem::kernels::gemm

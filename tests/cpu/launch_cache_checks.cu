// runtime/launch_cache.hpp's contract, checked on the host (tests/cpu/test_launch_cache.py). Without a usable GPU
// (CI) every attribute call fails: ensure_dynamic_smem must return the error cudaFuncSetAttribute returns, record
// nothing (so the next call tries again and fails the same way), and leave no sticky error for an unrelated later
// check. With a GPU the same program checks the success path: the attribute is recorded once, a second call for as
// many bytes or fewer succeeds from the record, and a larger request is set again.
#include <cstdio>

#include "tandem/kernels/runtime/launch_cache.hpp"

__global__ void needs_smem() {
  extern __shared__ char s[];
  if (threadIdx.x == 1023) s[0] = 1;
}

static int failures = 0;
static void expect(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

int main() {
  using namespace tandem::kernels::runtime;
  const cudaError_t direct = cudaFuncSetAttribute(needs_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10);
  (void)cudaGetLastError();
  // what the runtime keeps even after a cudaGetLastError (without a driver: cudaErrorInsufficientDriver, which no
  // call clears; with a GPU: nothing)
  const cudaError_t residual = cudaGetLastError();
  forget_dynamic_smem();
  const cudaError_t first = ensure_dynamic_smem(needs_smem, 100 << 10);
  expect(first == direct, "ensure_dynamic_smem returns what cudaFuncSetAttribute returns");
  expect(cudaGetLastError() == residual, "no error is left behind beyond what the runtime itself keeps");
  if (direct == cudaSuccess) {  // a failing request on a GPU (more shared memory than any SM has)
    const cudaError_t too_much = ensure_dynamic_smem(needs_smem, 1 << 20);
    expect(too_much != cudaSuccess, "an impossible size is refused");
    expect(cudaGetLastError() == cudaSuccess, "a refused size leaves no sticky error for a later check");
  }
  const cudaError_t again = ensure_dynamic_smem(needs_smem, 100 << 10);
  expect(again == direct, "a second call gives the same answer (a failure is not recorded as done)");
  const auto& raised = detail::dynamic_smem_cache().raised;
  if (direct != cudaSuccess) {
    expect(raised.empty(), "nothing is recorded after a failed call");
  } else {
    unsigned long long ctx = 0;
    if (detail::current_context_id(&ctx)) {
      expect(raised.size() == 1, "one record per kernel and context");
      expect(ensure_dynamic_smem(needs_smem, 64 << 10) == cudaSuccess, "fewer bytes: served from the record");
      expect(ensure_dynamic_smem(needs_smem, 200 << 10) == cudaSuccess, "more bytes: set again");
      expect(raised.begin()->second == (200 << 10), "the record follows the largest size set");
    }
  }
  std::printf("attribute call %s (%d); %d failure(s)\n", direct == cudaSuccess ? "succeeded" : "failed",
              static_cast<int>(direct), failures);
  if (failures == 0) std::printf("ok\n");
  return failures == 0 ? 0 : 1;
}

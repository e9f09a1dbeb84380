// Host-side check of the persistent-kernel runtime's argument checks (kernels/include/tandem/kernels/runtime/
// persistent.cuh: check_world, check_launch_common) and of the TP adapters' check_common on top of them
// (kernels/src/fused/tp_common.cuh): each fault alone gives its message and kInvalidArgument, a good call kOk.
// They are plain host code, so this runs on a machine without a GPU (no CUDA call is made). Also the timeline
// layouts of trace.cuh (TP's and MoE's). tests/cpu/test_runtime_checks.py compiles and runs it. Exit status 0 and
// "ok" on success.
#include "../../kernels/src/fused/tp_common.cuh"

#include <cstdio>
#include <string>

namespace rt = tandem::kernels::runtime;
namespace tp = tandem::kernels::tp;
using tandem::Status;
using tandem::kernels::gemm::DType;

static int bad = 0;

static void expect(const char* what, Status got, const std::string& why, Status want, const std::string& want_why) {
  if (got != want || (want != Status::kOk && why != want_why)) {
    std::printf("%s: got status %d \"%s\", want %d \"%s\"\n", what, static_cast<int>(got), why.c_str(),
                static_cast<int>(want), want_why.c_str());
    ++bad;
  }
}

int main() {
  alignas(256) static char heap[1 << 16];
  tandem::DeviceComm comm{};
  comm.rank = 0;
  comm.world = 4;
  comm.heap_base = heap;
  comm.heap_bytes = sizeof(heap);
  char* ws = heap + 4096;  // 256-byte aligned, inside the heap
  alignas(16) static char a[64], b[64], c[64];
  const DType bf16 = DType::kBF16;
  std::string why;

  // check_world
  for (int w : {0, -1, rt::kMaxWorld + 1}) {
    tandem::DeviceComm bad_comm = comm;
    bad_comm.world = w;
    why.clear();
    expect("check_world", rt::check_world(bad_comm, &why), why, Status::kInvalidArgument,
           "world size must be in [1, 64]");
  }
  for (int w : {1, rt::kMaxWorld}) {
    tandem::DeviceComm ok_comm = comm;
    ok_comm.world = w;
    expect("check_world ok", rt::check_world(ok_comm, &why), why, Status::kOk, "");
  }

  // check_launch_common: a good call, then each fault alone
  const auto common = [&](const tandem::DeviceComm& cm, DType dt, const void* x, const void* y, const void* w,
                          size_t bytes, size_t align) {
    why.clear();
    return rt::check_launch_common(cm, dt, {x, y}, "x, y", w, bytes, align, &why);
  };
  expect("common ok", common(comm, bf16, a, b, ws, 1024, 256), why, Status::kOk, "");
  expect("common ok fp16", common(comm, DType::kFP16, a, b, ws, 1024, 256), why, Status::kOk, "");
  {
    tandem::DeviceComm big = comm;
    big.world = 65;
    expect("common world", common(big, bf16, a, b, ws, 1024, 256), why, Status::kInvalidArgument,
           "world size must be in [1, 64]");
  }
  expect("common dtype", common(comm, static_cast<DType>(7), a, b, ws, 1024, 256), why, Status::kInvalidArgument,
         "dtype must be bf16 or fp16");
  expect("common null operand", common(comm, bf16, a, nullptr, ws, 1024, 256), why, Status::kInvalidArgument,
         "null pointer");
  expect("common misaligned operand", common(comm, bf16, a + 8, b, ws, 1024, 256), why, Status::kInvalidArgument,
         "x, y must be 16-byte aligned");
  expect("common null workspace", common(comm, bf16, a, b, nullptr, 1024, 256), why, Status::kInvalidArgument,
         "null workspace");
  expect("common workspace 256", common(comm, bf16, a, b, ws + 16, 1024, 256), why, Status::kInvalidArgument,
         "the workspace must be 256-byte aligned");
  expect("common workspace 16 ok", common(comm, bf16, a, b, ws + 16, 1024, 16), why, Status::kOk, "");
  expect("common workspace 16", common(comm, bf16, a, b, ws + 8, 1024, 16), why, Status::kInvalidArgument,
         "the workspace must be 16-byte aligned");
  expect("common workspace outside", common(comm, bf16, a, b, ws, sizeof(heap), 256), why,
         Status::kInvalidArgument, "the workspace must lie in the communicator's symmetric heap");
  {
    alignas(256) static char elsewhere[1024];
    expect("common workspace elsewhere", common(comm, bf16, a, b, elsewhere, 256, 256), why,
           Status::kInvalidArgument, "the workspace must lie in the communicator's symmetric heap");
  }
  // no operands (MoE checks its own): the workspace only
  why.clear();
  expect("common no operands", rt::check_launch_common(comm, bf16, {}, "", ws, 1024, 256, &why), why, Status::kOk,
         "");

  // the TP adapters' check_common: the runtime's checks, then the SM plan
  const auto tp_check = [&](const void* x, const void* w, int sm_count, int comm_blocks) {
    why.clear();
    tp::SmPlan plan;
    plan.sm_count = sm_count;
    plan.comm_blocks = comm_blocks;
    return tp::detail::check_common(comm, bf16, {x, b, c}, "A, B, C", w, 1024, plan, &why);
  };
  expect("tp ok", tp_check(a, ws, 132, 16), why, Status::kOk, "");
  expect("tp null", tp_check(nullptr, ws, 132, 16), why, Status::kInvalidArgument, "null pointer");
  expect("tp misaligned", tp_check(a + 4, ws, 132, 16), why, Status::kInvalidArgument,
         "A, B, C must be 16-byte aligned");
  expect("tp null workspace", tp_check(a, nullptr, 132, 16), why, Status::kInvalidArgument, "null workspace");
  expect("tp workspace 16 ok", tp_check(a, ws + 16, 132, 16), why, Status::kOk, "");
  expect("tp workspace misaligned", tp_check(a, ws + 8, 132, 16), why, Status::kInvalidArgument,
         "the workspace must be 16-byte aligned");
  expect("tp sm_count", tp_check(a, ws, 0, 16), why, Status::kInvalidArgument, "sm_count must be the SMs this rank has");
  expect("tp comm_blocks", tp_check(a, ws, 132, 3), why, Status::kInvalidArgument,
         "comm_blocks must be even and at least 2");
  expect("tp no GEMM SMs", tp_check(a, ws, 16, 16), why, Status::kInvalidArgument, "no SMs left for the GEMM");

  // the SM plan alone (TP with at least 1 SM, MoE with at least 4)
  expect("plan ok", rt::check_sm_plan(32, 4, 4, &why), why, Status::kOk, "");
  expect("plan few SMs", rt::check_sm_plan(3, 2, 4, &why), why, Status::kInvalidArgument,
         "sm_count must be the SMs this rank has");
  expect("plan odd comm_blocks", rt::check_sm_plan(32, 5, 4, &why), why, Status::kInvalidArgument,
         "comm_blocks must be even and at least 2");
  expect("plan no comm_blocks", rt::check_sm_plan(32, 0, 1, &why), why, Status::kInvalidArgument,
         "comm_blocks must be even and at least 2");
  expect("plan no GEMM SMs", rt::check_sm_plan(8, 8, 4, &why), why, Status::kInvalidArgument,
         "no SMs left for the GEMM");
  expect("plan two GEMM SMs", rt::check_sm_plan(8, 6, 4, &why), why, Status::kOk, "");

  // one world limit: the TP control block's per-rank flags hold kMaxWorld ranks
  static_assert(tp::detail::kMaxWorld == rt::kMaxWorld, "TP uses the runtime's world limit");
  static_assert(sizeof(tp::detail::Control::arrive) / sizeof(uint64_t) == rt::kMaxWorld, "a flag per rank");

  // timeline layouts: TP's (the SM in the last slot), MoE's (no SM slot: all 8 slots are the kernel's)
  static_assert(rt::Timeline::kBlocks == 256 && rt::Timeline::kSlots == 48 && rt::Timeline::kStampSlots == 47,
                "TP's timeline");
  using MoeLayout = rt::TimelineOf<512, 8, false>;
  static_assert(MoeLayout::kStampSlots == 8 && MoeLayout::kWords == 4096, "MoE's timeline");

  if (bad) {
    std::printf("%d failures\n", bad);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}

// Host-only use of the installed package (runs anywhere, no GPU): bootstrap, symmetric-heap allocator, error
// type, the proxy command queue, and the verbs work-request planner. CI builds and runs it.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tandem/transport/allocator.h"
#include "tandem/transport/bootstrap.h"
#include "tandem/transport/proxy.h"
#include "tandem/transport/status.h"
#include "tandem/transport/verbs_plan.h"

static int checks = 0, failures = 0;
#define EXPECT(cond)                                                   \
  do {                                                                 \
    ++checks;                                                          \
    if (!(cond)) {                                                     \
      ++failures;                                                      \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
    }                                                                  \
  } while (0)

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp/tandem-host-selftest";
  // Bootstrap (world of one) and its collectives.
  tandem::FileBootstrap boot(dir, 0, 1, std::chrono::seconds(5));
  EXPECT(boot.all_gather("selftest", "x") == std::vector<std::string>{"x"});
  // Allocator: symmetric offsets, alignment, reuse.
  tandem::RangeAllocator a(256, 1 << 20);
  const auto x = a.allocate(1000, 4096), y = a.allocate(10, 16);
  EXPECT(x && *x % 4096 == 0 && y && *y >= *x + 1000);
  EXPECT(a.release(*x) && !a.release(*x));
  EXPECT(a.allocate(1000, 4096) == x);
  // Errors carry rank, op and peer.
  try {
    throw tandem::Error(tandem::Status::kTimeout, "barrier", 3, 1, "waited");
  } catch (const tandem::Error& e) {
    EXPECT(e.status() == tandem::Status::kTimeout && e.rank() == 3 && e.peer() == 1 && e.op() == "barrier");
    EXPECT(std::string(e.what()) == "tandem: rank 3: barrier (peer 1): timeout: waited");
  }
  // Proxy queue: tickets in order, publication, back-pressure bound.
  tandem::proxy::CommandQueue q(4, 0);
  tandem::proxy::Command c{};
  c.op = static_cast<uint32_t>(tandem::proxy::CommandOp::kPut);
  c.peer = 1;
  for (uint64_t t = 0; t < 4; ++t) EXPECT(q.push(c, std::chrono::milliseconds(100)) == t);
  tandem::proxy::Command out{};
  EXPECT(q.peek(0, &out) && out.seq == 1 && out.peer == 1 && !q.peek(4, &out));
  bool full = false;
  try {
    q.push(c, std::chrono::milliseconds(50));  // nobody consumes: the ring stays full
  } catch (const tandem::Error& e) {
    full = e.status() == tandem::Status::kTimeout;
  }
  EXPECT(full);
  // Verbs planner: data write, then the ordered flag write.
  tandem::verbs::WrPlanner p({0x1000, 1, 1 << 20, 0, 0}, {{1, {0x9000, 2, 1 << 20}}}, {});
  tandem::proxy::Command ps{};
  ps.op = static_cast<uint32_t>(tandem::proxy::CommandOp::kPutSignal);
  ps.peer = 1;
  ps.bytes = 64;
  ps.sig_offset = 8;
  ps.sig_value = 5;
  p.add(ps, 0);
  const auto batches = p.take(true);
  EXPECT(batches.size() == 1 && batches[0].wrs.size() == 2);
  EXPECT(batches[0].wrs[1].opcode == tandem::verbs::WrOpcode::kRdmaWriteInline && batches[0].wrs[1].value == 5);
  std::printf("host_selftest: %d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}

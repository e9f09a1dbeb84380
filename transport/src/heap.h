// Symmetric heap backends (host code). One heap of identical size per rank; peers on the same node map each
// other's heaps into their own address space.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/transport/bootstrap.h"

namespace tandem {

class SymmetricHeap {
 public:
  virtual ~SymmetricHeap() = default;
  virtual char* local_base() const = 0;
  virtual uint64_t bytes() const = 0;
  // Local address of `rank`'s heap, nullptr if it is not mapped here (another node).
  virtual char* peer_base(int rank) const = 0;
  virtual const char* kind() const = 0;
};

struct HeapSetup {
  Bootstrap* bootstrap;
  std::string tag;              // unique bootstrap key prefix for this heap
  int rank;
  int world;
  std::vector<int> local_ranks; // ranks to map (same node), ascending, includes rank
  int device;
  uint64_t bytes;
  std::chrono::milliseconds timeout;
  std::string secret;           // the job secret (job_secret()): only its holders get our heap's fd
};

// True if this process can use the cuMem VMM path with POSIX fd export on `device`.
bool vmm_heap_supported(int device);
std::unique_ptr<SymmetricHeap> make_vmm_heap(const HeapSetup& setup);
std::unique_ptr<SymmetricHeap> make_ipc_heap(const HeapSetup& setup);

}  // namespace tandem

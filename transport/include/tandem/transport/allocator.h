// tandem transport — first-fit range allocator behind the symmetric heap.
//
// Pure host logic on offsets. Every rank runs the same sequence of alloc/free calls, so every rank hands out
// the same offsets: that is what makes an allocation "symmetric".
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

namespace tandem {

class RangeAllocator {
 public:
  RangeAllocator(uint64_t begin, uint64_t end);
  // Offset of a free range of `bytes` aligned to `align` (a power of two), or nullopt.
  std::optional<uint64_t> allocate(uint64_t bytes, uint64_t align);
  // Return a range obtained from allocate(). Returns false if `offset` is not a live allocation.
  bool release(uint64_t offset);
  uint64_t bytes_in_use() const { return in_use_; }
  uint64_t capacity() const { return end_ - begin_; }
  size_t live_allocations() const { return live_.size(); }
  uint64_t largest_free() const;

 private:
  uint64_t begin_, end_, in_use_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> size, coalesced
  std::map<uint64_t, uint64_t> live_;  // offset -> size (including alignment padding at its front)
  std::map<uint64_t, uint64_t> pad_;   // offset -> padding bytes in front of it
};

}  // namespace tandem

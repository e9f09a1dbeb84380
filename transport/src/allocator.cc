#include "tandem/transport/allocator.h"

#include <algorithm>

namespace tandem {

RangeAllocator::RangeAllocator(uint64_t begin, uint64_t end) : begin_(begin), end_(end) {
  if (end > begin) free_[begin] = end - begin;
}

std::optional<uint64_t> RangeAllocator::allocate(uint64_t bytes, uint64_t align) {
  if (bytes == 0) bytes = 1;
  if (align == 0 || (align & (align - 1)) != 0) return std::nullopt;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const uint64_t start = it->first, size = it->second;
    const uint64_t aligned = (start + align - 1) / align * align;
    const uint64_t pad = aligned - start;
    if (pad > size || size - pad < bytes) continue;
    free_.erase(it);
    const uint64_t used = pad + bytes;
    if (size > used) free_[start + used] = size - used;
    live_[aligned] = bytes;
    pad_[aligned] = pad;
    in_use_ += used;
    return aligned;
  }
  return std::nullopt;
}

bool RangeAllocator::release(uint64_t offset) {
  auto it = live_.find(offset);
  if (it == live_.end()) return false;
  const uint64_t pad = pad_[offset];
  uint64_t start = offset - pad, size = pad + it->second;
  live_.erase(it);
  pad_.erase(offset);
  in_use_ -= size;
  // Coalesce with the neighbours.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += size;
      return true;
    }
  }
  free_[start] = size;
  return true;
}

uint64_t RangeAllocator::largest_free() const {
  uint64_t best = 0;
  for (const auto& [off, size] : free_) best = std::max(best, size);
  return best;
}

}  // namespace tandem

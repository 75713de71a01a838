#include "kv/block_pool.h"

#include <algorithm>
#include <cassert>

namespace meshnet::kv {

BlockPool::BlockPool(size_t block_bytes, int64_t capacity_blocks, size_t slab_bytes)
    : block_bytes_(std::max<size_t>(block_bytes, 1)),
      stride_((block_bytes_ + 15) / 16 * 16),
      capacity_(std::max<int64_t>(capacity_blocks, 0)),
      blocks_per_slab_(std::max<int64_t>(1, static_cast<int64_t>(slab_bytes / stride_))) {}

uint8_t* BlockPool::Allocate() {
  if (!free_.empty()) {
    uint8_t* b = free_.back();
    free_.pop_back();
    return b;
  }
  if (allocated_ >= capacity_) return nullptr;
  const int64_t n = std::min(blocks_per_slab_, capacity_ - allocated_);
  // Reserve the free list's room first so that pushing the new blocks cannot
  // throw after the slab is taken.
  free_.reserve(static_cast<size_t>(allocated_ + n));
  slabs_.reserve(slabs_.size() + 1);
  auto slab = std::make_unique<uint8_t[]>(static_cast<size_t>(n) * stride_);  // zeroed
  uint8_t* base = slab.get();
  slabs_.push_back(std::move(slab));
  // Push in reverse so blocks are handed out in address order.
  for (int64_t i = n - 1; i >= 1; --i) free_.push_back(base + static_cast<size_t>(i) * stride_);
  allocated_ += n;
  return base;
}

void BlockPool::Free(uint8_t* block) {
  assert(block != nullptr);
  assert(static_cast<int64_t>(free_.size()) < allocated_);
  free_.push_back(block);  // capacity reserved in Allocate: never reallocates
}

}  // namespace meshnet::kv

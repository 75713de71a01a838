#include "kv/block_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <new>

namespace meshnet::kv {

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

uint8_t* MapAnonymous(size_t bytes, size_t* mapped) {
  const bool huge = bytes >= kHugePage;
  const size_t unit = huge ? kHugePage : kPage;
  const size_t len = (bytes + unit - 1) / unit * unit;
  const size_t slack = huge ? kHugePage : 0;  // room to align the start
  void* p = mmap(nullptr, len + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = huge ? (start + kHugePage - 1) & ~(kHugePage - 1) : start;
  if (aligned > start) munmap(p, aligned - start);
  const uintptr_t end = start + len + slack;
  if (end > aligned + len) munmap(reinterpret_cast<void*>(aligned + len), end - (aligned + len));
  if (huge) madvise(reinterpret_cast<void*>(aligned), len, MADV_HUGEPAGE);  // a hint; may fail
  *mapped = len;
  return reinterpret_cast<uint8_t*>(aligned);
}

BlockPool::BlockPool(size_t block_bytes, int64_t capacity_blocks, size_t slab_bytes)
    : block_bytes_(std::max<size_t>(block_bytes, 1)),
      stride_((block_bytes_ + 15) / 16 * 16),
      capacity_(std::max<int64_t>(capacity_blocks, 0)),
      blocks_per_slab_(std::max<int64_t>(1, static_cast<int64_t>(slab_bytes / stride_))) {}

uint8_t* BlockPool::Allocate() {
  if (!free_.empty()) {
    uint8_t* b = free_.back();
    free_.pop_back();
    in_use_[static_cast<size_t>(IndexOf(b))] = true;
    return b;
  }
  if (allocated_ >= capacity_) return nullptr;
  const int64_t n = std::min(blocks_per_slab_, capacity_ - allocated_);
  // Reserve the free list's room first so that pushing the new blocks cannot
  // throw after the slab is taken.
  free_.reserve(static_cast<size_t>(allocated_ + n));
  slabs_.reserve(slabs_.size() + 1);
  in_use_.reserve(static_cast<size_t>(allocated_ + n));
  size_t mapped = 0;
  uint8_t* base = MapAnonymous(static_cast<size_t>(n) * stride_, &mapped);  // zero pages
  const Slab slab{base, mapped, allocated_, n};
  slabs_.insert(std::upper_bound(slabs_.begin(), slabs_.end(), slab,
                                 [](const Slab& a, const Slab& b) {
                                   return std::less<const uint8_t*>()(a.base, b.base);
                                 }),
                slab);
  in_use_.resize(static_cast<size_t>(allocated_ + n), false);
  in_use_[static_cast<size_t>(allocated_)] = true;
  // Push in reverse so blocks are handed out in address order.
  for (int64_t i = n - 1; i >= 1; --i) free_.push_back(base + static_cast<size_t>(i) * stride_);
  allocated_ += n;
  return base;
}

BlockPool::~BlockPool() {
  for (const Slab& s : slabs_) munmap(s.base, s.bytes);
}

int64_t BlockPool::IndexOf(const uint8_t* block) const {
  // The last slab starting at or before `block`.
  auto it = std::upper_bound(
      slabs_.begin(), slabs_.end(), block,
      [](const uint8_t* p, const Slab& s) { return std::less<const uint8_t*>()(p, s.base); });
  if (it == slabs_.begin()) return -1;
  --it;
  const size_t offset = static_cast<size_t>(block - it->base);
  if (offset % stride_ != 0 || offset / stride_ >= static_cast<size_t>(it->blocks)) return -1;
  return it->first + static_cast<int64_t>(offset / stride_);
}

bool BlockPool::InUse(const uint8_t* block) const {
  const int64_t i = IndexOf(block);
  return i >= 0 && in_use_[static_cast<size_t>(i)];
}

void BlockPool::Free(uint8_t* block) {
  const int64_t i = IndexOf(block);
  if (i < 0 || !in_use_[static_cast<size_t>(i)]) {
    std::fprintf(stderr, "meshnet: BlockPool::Free of %s block %p\n",
                 i < 0 ? "a foreign" : "an already free", static_cast<void*>(block));
    std::abort();
  }
  in_use_[static_cast<size_t>(i)] = false;
  assert(static_cast<int64_t>(free_.size()) < allocated_);
  free_.push_back(block);  // capacity reserved in Allocate: never reallocates
}

}  // namespace meshnet::kv

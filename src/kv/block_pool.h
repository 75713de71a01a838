// BlockPool: fixed-size KV blocks carved lazily out of slabs.
//
// A block holds `block_tokens` positions of every owned layer (layout in
// ops/paged_kv.h: owned layer i has its K plane at (2i)*block_tokens*row_bytes
// and its V plane right after it). The pool is hard-capped at
// `capacity_blocks` blocks; memory is taken from the allocator in slabs of
// about `slab_bytes` only when the free list is empty, so a large budget is
// never preallocated. Freed blocks go on a LIFO free list and are reused
// first (O(1) allocate and free). Slabs are anonymous mappings (zero pages
// filled on first touch, 2 MiB-aligned transparent huge pages when large), and
// return to the system only when the pool is destroyed. Blocks are 16-byte aligned (the stride is
// block_bytes rounded up to 16; accounting uses block_bytes).
//
// Every block handed out is tracked (a bit per block), so Free() catches a
// double free and a pointer that is not a block of this pool: both abort with
// a message, as memory corruption would follow.
//
// Thread-safety: not thread-safe; HotKvStateManager guards it with its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace meshnet::kv {

// Anonymous memory of at least `bytes` (zero pages filled on first touch;
// 2 MiB-aligned and advised as transparent huge pages when at least one huge
// page long, which cuts first-touch faults 512x). Sets *mapped to the length
// to munmap. Throws std::bad_alloc. Used for the pool's slabs and for a KV
// import's staging buffer.
uint8_t* MapAnonymous(size_t bytes, size_t* mapped);

class BlockPool {
 public:
  static constexpr size_t kDefaultSlabBytes = size_t{2} << 20;

  // block_bytes >= 1, capacity_blocks >= 0, slab_bytes >= 1.
  BlockPool(size_t block_bytes, int64_t capacity_blocks, size_t slab_bytes = kDefaultSlabBytes);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block (contents unspecified: fresh slab memory is zeroed, a reused block
  // holds what its last owner wrote), or nullptr when `capacity_blocks` blocks
  // are in use. Throws std::bad_alloc if a new slab cannot be allocated.
  uint8_t* Allocate();
  // Returns a block obtained from Allocate() to the free list. Aborts on a
  // block that is not in use (double free) or not of this pool.
  void Free(uint8_t* block);
  // Whether `block` is a block of this pool handed out by Allocate() and not
  // freed since.
  bool InUse(const uint8_t* block) const;

  size_t block_bytes() const { return block_bytes_; }
  int64_t capacity() const { return capacity_; }
  int64_t used() const { return allocated_ - static_cast<int64_t>(free_.size()); }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t allocated() const { return allocated_; }  // carved from slabs so far
  int64_t slabs() const { return static_cast<int64_t>(slabs_.size()); }

 private:
  size_t block_bytes_;
  size_t stride_;
  int64_t capacity_;
  int64_t blocks_per_slab_;
  int64_t allocated_ = 0;
  struct Slab {
    uint8_t* base;
    size_t bytes;
    int64_t first;   // index of its first block
    int64_t blocks;  // blocks carved from it
  };
  // The index of `block`, or -1 if it is not the start of a block of a slab.
  int64_t IndexOf(const uint8_t* block) const;

  std::vector<Slab> slabs_;     // sorted by base address
  std::vector<uint8_t*> free_;  // LIFO
  std::vector<bool> in_use_;    // by block index
};

}  // namespace meshnet::kv

// A view of one owned layer's K/V rows over a paged block table.
//
// Block layout (see kv/block_pool.h): a block holds `block_tokens` positions of
// every owned layer. Within a block, owned layer i (0-based) has its K plane at
// byte offset (2*i) * block_tokens * row_bytes and its V plane right after it;
// each plane is [block_tokens][n_kv_heads][head_dim] in `dtype`.
//
// The view does not own anything; kv/ hands it out to a pinned step. Kernels
// read positions [0, n_positions) and write the reserved rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "util/dtype.h"

namespace meshnet::ops {

struct PagedKvLayer {
  uint8_t* const* blocks = nullptr;  // block base pointers, in table order
  int32_t block_tokens = 1;
  size_t k_offset = 0;   // byte offset of this layer's K plane in a block
  size_t v_offset = 0;   // byte offset of this layer's V plane in a block
  size_t row_bytes = 0;  // n_kv_heads * head_dim * KvDtypeSize(dtype)
  int n_kv_heads = 0;
  int head_dim = 0;
  KvDtype dtype = KvDtype::kF32;
  int64_t n_positions = 0;  // rows addressable: committed + reserved

  uint8_t* KRow(int64_t pos) const {
    return blocks[pos / block_tokens] + k_offset +
           static_cast<size_t>(pos % block_tokens) * row_bytes;
  }
  uint8_t* VRow(int64_t pos) const {
    return blocks[pos / block_tokens] + v_offset +
           static_cast<size_t>(pos % block_tokens) * row_bytes;
  }
};

}  // namespace meshnet::ops

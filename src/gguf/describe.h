// Human-readable description of a GGUF file, as printed by `meshnet inspect`:
// header, every metadata key (long arrays abbreviated to their first few
// elements and a count) and the tensor table (name, type, shape, bytes,
// absolute offset).
//
// Thread-safety: pure function of an immutable GgufFile.
#pragma once

#include <cstddef>
#include <string>

#include "gguf/gguf_reader.h"

namespace meshnet::gguf {

struct DescribeOptions {
  size_t max_array_elems = 8;  // array elements shown before "... (N total)"
  bool metadata = true;
  bool tensors = true;
};

std::string DescribeGguf(const GgufFile& f, const DescribeOptions& options = {});

}  // namespace meshnet::gguf

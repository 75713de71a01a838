// Test helper shared by the node/ tests: the shipped model's GGUF, opened once
// per test process (MESHNET_SHIPPED_MODEL is set by node/CMakeLists.txt).
#pragma once

#include <memory>

#include "gguf/gguf_reader.h"

namespace meshnet::node {

inline std::shared_ptr<const gguf::GgufFile> ShippedFile() {
  static auto file =
      std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(MESHNET_SHIPPED_MODEL));
  return file;
}

}  // namespace meshnet::node

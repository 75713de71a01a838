// libFuzzer target for the GGUF reader: any byte string must either parse
// into a GgufFile whose every view lies inside the input, or throw
// Error(kMalformedFile). Any other exception, crash or sanitizer report is a
// bug. Built only with -DMESHNET_FUZZ=ON; run by scripts/fuzz-gguf.sh.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "gguf/describe.h"
#include "gguf/gguf_reader.h"
#include "util/error.h"

namespace {

// Touches every byte a successful parse hands out, so ASan sees any overrun.
uint64_t Exercise(const meshnet::gguf::GgufFile& f) {
  using meshnet::gguf::MetadataValue;
  uint64_t sum = 0;
  for (const auto& e : f.metadata()) {
    sum += e.key.size() + e.value.ToString(4).size();
    // Typed getters must throw kMalformedFile or succeed, never anything else.
    try {
      sum += f.GetU32(e.key).value_or(0);
    } catch (const meshnet::Error&) {
    }
    try {
      sum += static_cast<uint64_t>(f.GetI64(e.key).value_or(0));
    } catch (const meshnet::Error&) {
    }
    try {
      sum += f.GetString(e.key).value_or("").size();
    } catch (const meshnet::Error&) {
    }
    try {
      sum += static_cast<uint64_t>(f.GetF32(e.key).value_or(0) != 0);
    } catch (const meshnet::Error&) {
    }
    try {
      sum += f.GetStringArray(e.key).value_or(std::span<const std::string_view>{}).size();
    } catch (const meshnet::Error&) {
    }
    try {
      sum += f.GetF32Array(e.key).value_or(std::vector<float>{}).size();
    } catch (const meshnet::Error&) {
    }
    try {
      sum += f.GetI32Array(e.key).value_or(std::vector<int32_t>{}).size();
    } catch (const meshnet::Error&) {
    }
    if (e.value.is_array() && e.value.array_size() > 0) {
      sum += e.value.ArrayElement(e.value.array_size() - 1).ToString(2).size();
    }
  }
  for (const auto& t : f.tensors()) {
    if (f.FindTensor(t.name) != &t) std::abort();
    if (t.offset + t.n_bytes > f.file_size() || t.offset % f.alignment() != 0) std::abort();
    const auto* p = static_cast<const uint8_t*>(t.data);
    sum += p[0] + p[t.n_bytes - 1];
    sum += static_cast<uint64_t>(t.rows()) + t.row_bytes() + t.ShapeString().size();
  }
  sum += meshnet::gguf::DescribeGguf(f, {.max_array_elems = 3}).size();
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = meshnet::gguf::GgufFile::FromBytes(std::span<const uint8_t>(data, size));
    volatile uint64_t sink = Exercise(f);
    (void)sink;
  } catch (const meshnet::Error& e) {
    if (e.kind() != meshnet::ErrorKind::kMalformedFile) {
      std::fprintf(stderr, "unexpected error kind: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}

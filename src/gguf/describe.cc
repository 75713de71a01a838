#include "gguf/describe.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "gguf/internal.h"
#include "util/sizes.h"

namespace meshnet::gguf {

namespace {

// File contents (keys, names) may hold terminal escapes or invalid UTF-8:
// everything taken from the file is printed escaped, never raw.
std::string Shown(std::string_view s) { return internal::Escaped(s, s.size()); }

std::string TypeLabel(const MetadataValue& v) {
  if (!v.is_array()) return std::string(ValueTypeName(v.type()));
  return "array[" + std::string(ValueTypeName(v.array_type())) + "; " +
         std::to_string(v.array_size()) + "]";
}

void AppendPadded(std::string* out, const std::string& s, size_t width) {
  *out += s;
  if (s.size() < width) out->append(width - s.size(), ' ');
}

}  // namespace

std::string DescribeGguf(const GgufFile& f, const DescribeOptions& options) {
  std::string out;
  out += "file:        " + Shown(f.name()) + " (" + std::to_string(f.file_size()) + " bytes, " +
         FormatByteSize(static_cast<int64_t>(f.file_size())) + ")\n";
  out += "version:     GGUF v" + std::to_string(f.version()) + "\n";
  out += "alignment:   " + std::to_string(f.alignment()) + "\n";
  out += "data offset: " + std::to_string(f.data_offset()) + "\n";

  if (options.metadata) {
    out += "\nmetadata (" + std::to_string(f.metadata().size()) + " keys):\n";
    size_t key_w = 0, type_w = 0;
    for (const auto& e : f.metadata()) {
      key_w = std::max(key_w, Shown(e.key).size());
      type_w = std::max(type_w, TypeLabel(e.value).size());
    }
    for (const auto& e : f.metadata()) {
      out += "  ";
      AppendPadded(&out, Shown(e.key), key_w);
      out += "  ";
      AppendPadded(&out, TypeLabel(e.value), type_w);
      out += "  = " + e.value.ToString(options.max_array_elems) + "\n";
    }
  }

  if (options.tensors) {
    int64_t n_params = 0;
    uint64_t n_bytes = 0;
    size_t name_w = 4, shape_w = 5;
    for (const auto& t : f.tensors()) {
      n_params += t.n_elements;
      n_bytes += t.n_bytes;
      name_w = std::max(name_w, Shown(t.name).size());
      shape_w = std::max(shape_w, t.ShapeString().size());
    }
    out += "\ntensors (" + std::to_string(f.tensors().size()) + ", " + std::to_string(n_params) +
           " elements, " + FormatByteSize(static_cast<int64_t>(n_bytes)) + "):\n";
    out += "  ";
    AppendPadded(&out, "name", name_w);
    out += "  type  ";
    AppendPadded(&out, "shape", shape_w);
    out += "  " + std::string(12 - 5, ' ') + "bytes  offset\n";
    for (const auto& t : f.tensors()) {
      out += "  ";
      AppendPadded(&out, Shown(t.name), name_w);
      out += "  ";
      AppendPadded(&out, std::string(GgmlTypeInfoOf(t.type).name), 4);
      out += "  ";
      AppendPadded(&out, t.ShapeString(), shape_w);
      char nums[64];
      std::snprintf(nums, sizeof nums, "  %12llu  %llu\n",
                    static_cast<unsigned long long>(t.n_bytes),
                    static_cast<unsigned long long>(t.offset));
      out += nums;
    }
  }
  return out;
}

}  // namespace meshnet::gguf

// meshnet inspect FILE.gguf: prints the GGUF version, metadata (long arrays
// abbreviated) and tensor table. A malformed file is reported with the
// reader's message and exit code 2 (main() maps meshnet::Error to 2). Keys,
// strings and tensor names from the file are printed escaped (gguf/describe.h).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/flags.h"
#include "gguf/describe.h"
#include "gguf/gguf_reader.h"

namespace meshnet::cli {
namespace {

void SetupInspect(CLI::App* sub, int* exit_code) {
  struct Flags {
    std::string path;
    size_t max_array = 8;
    bool no_metadata = false;
    bool no_tensors = false;
  };
  auto flags = std::make_shared<Flags>();
  sub->add_option("file", flags->path, "GGUF file to inspect")->required();
  sub->add_option("--max-array", flags->max_array, "Array elements shown before the count")
      ->capture_default_str()
      ->check(IntRange(0, 1 << 20));
  sub->add_flag("--no-metadata", flags->no_metadata, "Do not print the metadata");
  sub->add_flag("--no-tensors", flags->no_tensors, "Do not print the tensor table");
  sub->footer("Exit status: 0 on success, 2 for an unreadable or malformed file.");
  sub->callback([flags, exit_code] {
    // Throws Error(kMalformedFile / kInvalidArgument): main() prints it, exit 2.
    const gguf::GgufFile f = gguf::GgufFile::Open(flags->path, gguf::GgufFile::Access::kSequential);
    gguf::DescribeOptions options;
    options.max_array_elems = flags->max_array;
    options.metadata = !flags->no_metadata;
    options.tensors = !flags->no_tensors;
    const std::string text = gguf::DescribeGguf(f, options);
    *exit_code = std::fwrite(text.data(), 1, text.size(), stdout) == text.size() ? 0 : 1;
  });
}

const CommandRegistrar kInspectCommand({"inspect",
                                        "Print a GGUF file's version, metadata and tensor table",
                                        SetupInspect});

}  // namespace
}  // namespace meshnet::cli

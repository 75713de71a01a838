// Helpers shared by the template tests: the test data folder and running the Python reference.
#pragma once

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

namespace meshnet::jinja::testutil {

inline const std::filesystem::path kDataDir =
    std::filesystem::path(MESHNET_SOURCE_DIR) / "tests/data/templates";

inline std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs a shell command, returns its stdout and exit status.
inline std::pair<std::string, int> Run(const std::string& cmd) {
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {"", -1};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  return {out, pclose(pipe)};
}

// Python with jinja2 (Debian python3-jinja2), the reference renderer.
inline bool ReferenceAvailable() {
  return Run(std::string(MESHNET_PYTHON) + " -c 'import jinja2' 2>/dev/null").second == 0;
}

}  // namespace meshnet::jinja::testutil

// Helpers the benchmarks share: a temporary directory, the 768-dim random
// model they measure with, and CPU-time readings of this and other processes.
#pragma once

#include <stdlib.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include "gguf/make_model.h"
#include "ops/ggml_type.h"

namespace meshnet::bench {

// A fresh temporary directory <tmp>/<prefix>.XXXXXX, removed with what is in
// it on destruction (the models a benchmark writes are never kept).
struct TempDir {
  explicit TempDir(const std::string& prefix) {
    std::string t = (std::filesystem::temp_directory_path() / (prefix + ".XXXXXX")).string();
    if (mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path path;
};

// Writes dir/<name>.gguf (general.name `name`) and returns its path: the
// 768-dim, 12-layer random Llama (12 heads, n_ff 2048) of weight type `type`
// with the tokenizer of `tokenizer_from`; the same as
//   meshnet make-model --n-embd 768 --n-layers 12 --type TYPE --seed 7
//     --context CONTEXT --tokenizer-from TOKENIZER_FROM --name NAME
inline std::string MakeLlama768(const std::filesystem::path& dir, const std::string& name,
                                GgmlType type, int64_t context, const std::string& tokenizer_from) {
  gguf::MakeModelOptions o;  // defaults: 768-dim, 12 layers, 12 heads, ff 2048
  o.type = type;
  o.name = name;
  o.seed = 7;
  o.context = context;
  const std::string path = (dir / (name + ".gguf")).string();
  gguf::MakeModel(o, tokenizer_from, path);
  return path;
}

// The same model (general.name "meshnet-random", context 1024 unless given,
// the shipped tokenizer `tokenizer_from`), kept across runs as
// $MESHNET_BENCH_DIR/llama768-<TYPE>.gguf (-ctx<N> before .gguf for another
// context; default dir /tmp/meshnet-bench): written once, to a temporary name
// first, so a run cut short leaves no half file.
inline std::string CachedLlama768(GgmlType type, const std::string& tokenizer_from,
                                  int64_t context = 1024) {
  const char* dir_env = std::getenv("MESHNET_BENCH_DIR");
  const std::filesystem::path dir = dir_env ? dir_env : "/tmp/meshnet-bench";
  std::filesystem::create_directories(dir);
  const std::string suffix = context == 1024 ? "" : "-ctx" + std::to_string(context);
  const std::filesystem::path path =
      dir / (std::string("llama768-") + std::string(GgmlTypeInfoOf(type).name) + suffix + ".gguf");
  if (!std::filesystem::exists(path)) {
    gguf::MakeModelOptions o;  // 768-dim, 12 layers, 12 heads, n_ff 2048
    o.type = type;
    o.seed = 7;
    o.context = context;
    const std::string tmp = path.string() + ".tmp" + std::to_string(getpid());
    gguf::MakeModel(o, tokenizer_from, tmp);
    std::filesystem::rename(tmp, path);
  }
  return path.string();
}

// CPU seconds (user + system) this process has used.
inline double SelfCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// CPU seconds (utime + stime) of another process, from /proc/<pid>/stat.
inline double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));  // after "(comm) "
  std::string f;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stod(f);
    if (i == 15) stime = std::stod(f);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace meshnet::bench

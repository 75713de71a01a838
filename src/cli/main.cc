// meshnet: a node and a client for a pipeline-parallel LLM inference mesh.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "cli/command.h"
#include "ops/simd_targets.h"
#include "util/error.h"

namespace meshnet::cli {

std::vector<CommandSpec>& Commands() {
  static std::vector<CommandSpec> commands;
  return commands;
}

}  // namespace meshnet::cli

int main(int argc, char** argv) {
  using namespace meshnet::cli;
  CLI::App app{"meshnet: pipeline-parallel LLM inference over a mesh of shard nodes"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("meshnet ") + MESHNET_VERSION_STRING);
  app.footer(
      "Environment: MESHNET_DISABLE_SIMD=AVX3_DL,AVX3 leaves those SIMD targets out (compute\n"
      "as a CPU without them does, bit for bit); an unknown name exits 2.");
  int exit_code = 0;
  // MESHNET_DISABLE_SIMD=AVX3_DL,AVX3: compute as a CPU without those targets.
  if (const char* off = std::getenv("MESHNET_DISABLE_SIMD"); off != nullptr) {
    try {
      meshnet::ops::DisableSimdTargets(off);
    } catch (const meshnet::Error& e) {
      std::fprintf(stderr, "meshnet: error: MESHNET_DISABLE_SIMD: %s\n", e.what());
      return 2;
    }
  }
  auto& commands = Commands();
  std::sort(commands.begin(), commands.end(),
            [](const CommandSpec& a, const CommandSpec& b) { return a.name < b.name; });
  for (auto& spec : commands) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.description);
    spec.setup(sub, &exit_code);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const meshnet::Error& e) {
    std::fprintf(stderr, "meshnet: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshnet: error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}

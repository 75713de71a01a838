// Subcommand registration for the `meshnet` executable.
//
// Each <name>_cmd.cc defines one static CommandRegistrar; main() adds every
// registered command to the CLI11 app. A command's setup function declares its
// flags and sets a callback that runs it; the callback returns the process exit
// code through `*exit_code`.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace meshnet::cli {

struct CommandSpec {
  std::string name;
  std::string description;
  // Declares flags on `sub` and sets sub->callback(...). Write the exit code of
  // the run into *exit_code.
  std::function<void(CLI::App* sub, int* exit_code)> setup;
};

std::vector<CommandSpec>& Commands();

struct CommandRegistrar {
  explicit CommandRegistrar(CommandSpec spec) { Commands().push_back(std::move(spec)); }
};

}  // namespace meshnet::cli

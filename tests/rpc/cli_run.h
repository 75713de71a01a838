// Test helper: runs `meshnet <args...>` to completion with a time limit and
// returns its exit status, stdout and stderr. A run that outlives the limit
// is killed (SIGKILL) and reported as timed out, so a hang fails the test
// instead of stalling it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "util/die_with_parent.h"

namespace meshnet::rpc::testing {

struct CliResult {
  bool timed_out = false;
  int exit_code = -1;  // when the process exited normally
  int signal = 0;      // when a signal ended it
  std::string out;
  std::string err;
};

// `after_start(pid)` runs once the child is started (e.g. to signal it).
// `stdin_path`: file opened as the child's stdin (default /dev/null).
inline CliResult RunCli(const std::string& binary, const std::vector<std::string>& args,
                        double timeout_s, const std::function<void(pid_t)>& after_start = {},
                        const std::string& stdin_path = "/dev/null") {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe failed");
  }
  std::vector<std::string> argv_s = {binary};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    DieWithParent(parent);
    const int in = open(stdin_path.c_str(), O_RDONLY);
    if (in >= 0) dup2(in, STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  if (after_start) after_start(pid);
  CliResult r;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      r.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, static_cast<int>(left)) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0 && sinks[i]->size() < (1u << 20)) sinks[i]->append(buf, static_cast<size_t>(n));
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);  // both pipes closed (exit) or SIGKILL sent: prompt
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

}  // namespace meshnet::rpc::testing

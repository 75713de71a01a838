// Test helper: a `meshnet serve` child process on 127.0.0.1. Starts it, reads
// the bound address from its first stdout line, and kills and reaps it on
// destruction. Its stderr goes to a log file that failing tests can print.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "util/die_with_parent.h"

namespace meshnet::rpc::testing {

class NodeProcess {
 public:
  // Runs `binary serve <args...>`; waits up to `timeout_s` for "listening on"
  // (and "metrics on" when `expect_metrics`). Throws with the log on failure.
  // `subcommand` and `first_line` run another long-lived command the same way
  // (e.g. "registry" and "registry on ").
  NodeProcess(const std::string& binary, const std::vector<std::string>& args,
              const std::string& log_path, bool expect_metrics = false, double timeout_s = 30,
              const std::string& subcommand = "serve",
              const std::string& first_line = "listening on ")
      : log_path_(log_path) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    std::vector<std::string> argv_s = {binary, subcommand};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      DieWithParent(parent);
      dup2(out[1], STDOUT_FILENO);
      const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (log >= 0) dup2(log, STDERR_FILENO);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    out_fd_ = out[0];
    const std::string first = ReadLine(timeout_s);
    if (first.rfind(first_line, 0) != 0) Fail("no '" + first_line + "' line (got '" + first + "')");
    address_ = first.substr(first_line.size());
    if (expect_metrics) {
      const std::string second = ReadLine(timeout_s);
      if (second.rfind("metrics on ", 0) != 0) Fail("no 'metrics on' line");
      metrics_address_ = second.substr(11);
    }
  }

  ~NodeProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
  }
  NodeProcess(const NodeProcess&) = delete;
  NodeProcess& operator=(const NodeProcess&) = delete;

  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  std::string port() const { return address_.substr(address_.rfind(':') + 1); }
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // Sends `sig` and reaps the child within `timeout_s` (SIGKILL after that).
  // Returns the wait status.
  int Stop(int sig, double timeout_s = 20) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    while (true) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      // Polling a child's exit has no blocking-with-timeout form in POSIX.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
    return status;
  }

  std::string Log() const {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string ReadLine(double timeout_s) {
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) return line;
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char c;
      const ssize_t n = read(out_fd_, &c, 1);
      if (n <= 0) return line;  // the child exited
      if (c == '\n') return line;
      line += c;
    }
  }

  [[noreturn]] void Fail(const std::string& what) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    throw std::runtime_error("meshnet serve: " + what + "\n--- log ---\n" + Log());
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string log_path_;
  std::string address_;
  std::string metrics_address_;
};

}  // namespace meshnet::rpc::testing

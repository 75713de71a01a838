#include "mesh/multi_session.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <system_error>
#include <thread>

namespace meshnet::mesh {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Shared by the workers of one Run(): the next session to start and where
// each one's outcome goes (each outcome is written by one worker only).
struct RunState {
  RouteProvider& provider;
  std::span<const std::vector<int32_t>> prompts;
  const GenerateOptions& options;
  const MultiSessionEvents& events;
  Clock::time_point t0;
  std::vector<SessionOutcome>& outcomes;
  std::atomic<size_t> next{0};
};

void RunSession(RunState& st, size_t i) {
  SessionOutcome& o = st.outcomes[i];
  o.token_times_s.reserve(static_cast<size_t>(std::max(0, st.options.max_tokens)));
  GenerateEvents ev;
  ev.on_token = [&st, &o, i](int32_t token) {
    o.token_times_s.push_back(Since(st.t0));
    if (st.events.on_token) st.events.on_token(static_cast<int>(i), token);
  };
  if (st.events.stop_requested) {
    ev.stop_requested = [&st, i] { return st.events.stop_requested(static_cast<int>(i)); };
  }
  o.started_s = Since(st.t0);
  try {
    o.result = Generate(st.provider, st.prompts[i], st.options, ev);
    o.ok = true;
  } catch (const Error& e) {
    o.error_kind = e.kind();
    o.error = e.what();
  } catch (const std::exception& e) {
    o.error = e.what();
  }
  o.finished_s = Since(st.t0);
}

void WorkLoop(RunState& st) {
  for (size_t i = st.next.fetch_add(1); i < st.prompts.size(); i = st.next.fetch_add(1)) {
    RunSession(st, i);
  }
}

}  // namespace

double SessionOutcome::TimeToFirstToken() const {
  return token_times_s.empty() ? -1.0 : token_times_s.front() - started_s;
}

int64_t MultiSessionReport::TotalTokens() const {
  int64_t n = 0;
  for (const auto& s : sessions) n += static_cast<int64_t>(s.token_times_s.size());
  return n;
}

int MultiSessionReport::failed() const {
  return static_cast<int>(
      std::count_if(sessions.begin(), sessions.end(), [](const auto& s) { return !s.ok; }));
}

double MultiSessionReport::TokensPerSecond() const {
  return wall_s > 0 ? static_cast<double>(TotalTokens()) / wall_s : 0.0;
}

std::vector<double> MultiSessionReport::InterTokenGaps() const {
  std::vector<double> gaps;
  for (const auto& s : sessions) {
    for (size_t k = 1; k < s.token_times_s.size(); ++k) {
      gaps.push_back(s.token_times_s[k] - s.token_times_s[k - 1]);
    }
  }
  return gaps;
}

std::vector<double> MultiSessionReport::TimesToFirstToken() const {
  std::vector<double> out;
  for (const auto& s : sessions) {
    if (!s.token_times_s.empty()) out.push_back(s.TimeToFirstToken());
  }
  return out;
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  const double clamped = std::clamp(q, 0.0, 1.0);
  size_t rank = static_cast<size_t>(std::ceil(clamped * static_cast<double>(values.size())));
  rank = std::clamp<size_t>(rank, 1, values.size());
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(rank - 1),
                   values.end());
  return values[rank - 1];
}

MultiSessionDriver::MultiSessionDriver(RouteProvider& provider, MultiSessionOptions options)
    : provider_(provider), options_(options) {
  if (options_.max_in_flight < 0 || options_.max_in_flight > MultiSessionOptions::kMaxInFlight) {
    ThrowInvalidArgument("max_in_flight must be in 0.." +
                         std::to_string(MultiSessionOptions::kMaxInFlight) + ", got " +
                         std::to_string(options_.max_in_flight));
  }
}

MultiSessionReport MultiSessionDriver::Run(std::span<const std::vector<int32_t>> prompts,
                                           const GenerateOptions& options,
                                           const MultiSessionEvents& events) {
  if (!options.session_id.empty() || !options.session_secret.empty()) {
    ThrowInvalidArgument("every session of a multi-session run gets its own id and secret");
  }
  MultiSessionReport report;
  report.sessions.resize(prompts.size());
  if (prompts.empty()) return report;
  const size_t cap = options_.max_in_flight == 0
                         ? static_cast<size_t>(MultiSessionOptions::kMaxInFlight)
                         : static_cast<size_t>(options_.max_in_flight);
  const size_t workers = std::min(prompts.size(), cap);
  RunState st{provider_, prompts, options, events, Clock::now(), report.sessions};
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (size_t w = 1; w < workers; ++w) {
    try {
      threads.emplace_back([&st] { WorkLoop(st); });
    } catch (const std::system_error&) {
      break;  // the OS refused a thread: fewer sessions at once, none lost
    }
  }
  WorkLoop(st);  // the caller is a worker too
  for (auto& t : threads) t.join();
  report.wall_s = Since(st.t0);
  return report;
}

}  // namespace meshnet::mesh

#include "cli/generate_load.h"

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "mesh/multi_session.h"
#include "util/error.h"
#include "util/hash.h"

namespace meshnet::cli {
namespace {

double Ms(double seconds) { return seconds * 1e3; }

// 8 hex digits of FNV-1a over the ids' little-endian bytes: equal outputs at
// a glance.
std::string Digest(const std::vector<int32_t>& ids) {
  std::string bytes;
  for (int32_t id : ids) {
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>((id >> (8 * b)) & 0xff));
  }
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", Fnv1a32(bytes));
  return buf;
}

// The text on one line: newlines and other control bytes as escapes.
std::string OneLine(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

nlohmann::ordered_json Aggregate(const mesh::MultiSessionReport& r) {
  const std::vector<double> ttft = r.TimesToFirstToken();
  const std::vector<double> gaps = r.InterTokenGaps();
  nlohmann::ordered_json a;
  a["sessions"] = r.sessions.size();
  a["failed"] = r.failed();
  a["tokens"] = r.TotalTokens();
  a["wall_s"] = r.wall_s;
  a["tokens_per_s"] = r.TokensPerSecond();
  a["ttft_ms"] = {{"p50", Ms(mesh::Percentile(ttft, 0.5))},
                  {"p99", Ms(mesh::Percentile(ttft, 0.99))}};
  a["inter_token_ms"] = {{"p50", Ms(mesh::Percentile(gaps, 0.5))},
                         {"p99", Ms(mesh::Percentile(gaps, 0.99))}};
  return a;
}

void PrintText(const mesh::MultiSessionReport& r, const std::vector<std::string>& texts) {
  for (size_t i = 0; i < r.sessions.size(); ++i) {
    const mesh::SessionOutcome& s = r.sessions[i];
    if (!s.ok) continue;
    std::printf("session %zu: %zu tokens, ttft %.1f ms, digest %s: %s\n", i,
                s.result.generated_ids.size(), Ms(s.TimeToFirstToken()),
                Digest(s.result.generated_ids).c_str(), OneLine(texts[i]).c_str());
  }
  const nlohmann::ordered_json a = Aggregate(r);
  std::printf(
      "sessions %zu, failed %d, tokens %lld in %.3f s: %.1f tokens/s; ttft p50 %.1f ms, p99 %.1f "
      "ms; inter-token p50 %.2f ms, p99 %.2f ms\n",
      r.sessions.size(), r.failed(), static_cast<long long>(r.TotalTokens()), r.wall_s,
      r.TokensPerSecond(), a["ttft_ms"]["p50"].get<double>(), a["ttft_ms"]["p99"].get<double>(),
      a["inter_token_ms"]["p50"].get<double>(), a["inter_token_ms"]["p99"].get<double>());
}

void PrintJson(const mesh::MultiSessionReport& r, const std::vector<std::string>& texts) {
  nlohmann::ordered_json out;
  out["sessions"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.sessions.size(); ++i) {
    const mesh::SessionOutcome& s = r.sessions[i];
    nlohmann::ordered_json one;
    one["generated_ids"] = s.result.generated_ids;
    one["text"] = texts[i];
    one["ttft_ms"] = Ms(s.TimeToFirstToken());
    if (!s.ok) one["error"] = s.error;
    out["sessions"].push_back(std::move(one));
  }
  out["aggregate"] = Aggregate(r);
  std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

}  // namespace

void CheckLoadSessions(int sessions) {
  if (sessions < 1 || sessions > kMaxLoadSessions) {
    ThrowInvalidArgument("--sessions must be in 1.." + std::to_string(kMaxLoadSessions) + ", got " +
                         std::to_string(sessions));
  }
}

int RunGenerateSessions(mesh::RouteProvider& provider, const model::Tokenizer& tokenizer,
                        const std::vector<int32_t>& prompt_ids,
                        const mesh::GenerateOptions& options, int sessions, bool json,
                        int (*interrupted)()) {
  CheckLoadSessions(sessions);
  const std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(sessions), prompt_ids);
  mesh::MultiSessionDriver driver(provider, {.max_in_flight = sessions});
  const mesh::MultiSessionReport r = driver.Run(prompts, options);
  if (const int sig = interrupted(); sig != 0) {
    std::fprintf(stderr, "meshnet: interrupted; every session was released\n");
    return 128 + sig;
  }
  std::vector<std::string> texts;  // as a solo run streams them: pieces after the prompt
  for (const mesh::SessionOutcome& s : r.sessions) {
    std::string text;
    int32_t prev = prompt_ids.back();
    for (int32_t id : s.result.generated_ids) {
      text += tokenizer.DecodePiece(prev, id);
      prev = id;
    }
    texts.push_back(std::move(text));
  }
  if (json) {
    PrintJson(r, texts);
  } else {
    PrintText(r, texts);
  }
  for (size_t i = 0; i < r.sessions.size(); ++i) {
    if (!r.sessions[i].ok) {
      std::fprintf(stderr, "meshnet: error: session %zu: %s\n", i, r.sessions[i].error.c_str());
    }
  }
  return r.failed() == 0 ? 0 : 2;
}

}  // namespace meshnet::cli

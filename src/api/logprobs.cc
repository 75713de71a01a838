#include "api/logprobs.h"

#include <algorithm>

#include "shard/logit_adjustments.h"

namespace meshnet::api {
namespace {

using nlohmann::json;

json Bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

json ChatEntry(const TokenLogprob& e) {
  json top = json::array();
  for (const auto& [token, logprob] : e.top) {
    top.push_back({{"token", token}, {"logprob", logprob}, {"bytes", Bytes(token)}});
  }
  return {{"token", e.token},
          {"logprob", e.logprob},
          {"bytes", Bytes(e.token)},
          {"top_logprobs", std::move(top)}};
}

}  // namespace

LogprobTracker::LogprobTracker(const model::Tokenizer& tokenizer, int top_n)
    : tokenizer_(tokenizer), top_n_(top_n) {}

void LogprobTracker::Row(std::span<const float> logits) {
  if (on()) row_.assign(logits.begin(), logits.end());
}

void LogprobTracker::Token(int32_t prev, int32_t id, const std::string& piece) {
  if (!on()) return;
  TokenLogprob e;
  e.id = id;
  e.token = piece;
  e.text_offset = raw_;
  raw_ += piece.size();
  if (!row_.empty() && static_cast<size_t>(id) < row_.size()) {
    const float lse = shard::LogSumExp(row_);
    e.logprob = shard::Logprob(row_, id, lse);
    for (const shard::TopLogprob& t : shard::TopLogprobs(row_, top_n_, lse)) {
      e.top.emplace_back(tokenizer_.DecodePiece(prev, t.id), t.logprob);
    }
  }
  entries_.push_back(std::move(e));
}

std::span<const TokenLogprob> LogprobTracker::Take(size_t released) {
  const size_t from = taken_;
  while (taken_ < entries_.size() && entries_[taken_].text_offset < released) ++taken_;
  return std::span<const TokenLogprob>(entries_).subspan(from, taken_ - from);
}

std::vector<TokenLogprob> LogprobTracker::Released(size_t length) const {
  std::vector<TokenLogprob> out;
  for (const TokenLogprob& e : entries_) {
    if (e.text_offset < length) out.push_back(e);
  }
  return out;
}

json LogprobsJson(std::span<const TokenLogprob> entries, bool chat) {
  if (chat) {
    json content = json::array();
    for (const TokenLogprob& e : entries) content.push_back(ChatEntry(e));
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const TokenLogprob& e : entries) {
    tokens.push_back(e.token);
    logprobs.push_back(e.logprob);
    json alternatives = json::object();
    for (const auto& [token, logprob] : e.top) {
      if (!alternatives.contains(token)) alternatives[token] = logprob;
    }
    top.push_back(std::move(alternatives));
    offsets.push_back(e.text_offset);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace meshnet::api

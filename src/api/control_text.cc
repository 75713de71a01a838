#include "api/control_text.h"

#include <algorithm>
#include <random>

#include "api/api_error.h"

namespace meshnet::api {
namespace {

using nlohmann::ordered_json;

std::string Marker(const std::string& nonce, int index) {
  return "@@" + nonce + "#" + std::to_string(index) + "@@";
}

std::string NewNonce() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::string digits = std::to_string(rng());
  return digits + std::to_string(rng());
}

[[noreturn]] void CutMarker() {
  throw ApiError(400,
                 "the chat template cut apart the text of a control token in the messages "
                 "(start meshnet api with --allow-control-in-content to pass such text through)",
                 "invalid_request_error", "messages", "template_error");
}

}  // namespace

ControlTextMask::ControlTextMask(const model::Tokenizer& tokenizer) {
  for (model::TokenId id = 0; id < tokenizer.vocab_size(); ++id) {
    const model::TokenType type = tokenizer.Type(id);
    const std::string& text = tokenizer.TokenText(id);
    if ((type == model::TokenType::kControl || type == model::TokenType::kUnknown) &&
        !text.empty()) {
      texts_.push_back(text);
    }
  }
  for (int i = 0; i < static_cast<int>(texts_.size()); ++i) {
    by_first_[static_cast<unsigned char>(texts_[i][0])].push_back(i);
  }
  for (auto& bucket : by_first_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [this](int a, int b) { return texts_[a].size() > texts_[b].size(); });
  }
}

std::string ControlTextMask::MaskString(const std::string& s, const std::string& nonce,
                                        int* markers) const {
  std::string out;
  size_t copied = 0;
  for (size_t i = 0; i < s.size();) {
    const std::vector<int>& bucket = by_first_[static_cast<unsigned char>(s[i])];
    auto hit = std::find_if(bucket.begin(), bucket.end(),
                            [&](int t) { return s.compare(i, texts_[t].size(), texts_[t]) == 0; });
    if (hit == bucket.end()) {
      ++i;
      continue;
    }
    out.append(s, copied, i - copied);
    out += Marker(nonce, *hit);
    ++*markers;
    i += texts_[*hit].size();
    copied = i;
  }
  if (copied == 0) return s;
  out.append(s, copied, std::string::npos);
  return out;
}

void ControlTextMask::MaskJson(ordered_json& j, const std::string& nonce, int* markers) const {
  if (j.is_string()) {
    j = MaskString(j.get<std::string>(), nonce, markers);
  } else if (j.is_array()) {
    for (ordered_json& v : j) MaskJson(v, nonce, markers);
  } else if (j.is_object()) {
    ordered_json masked = ordered_json::object();
    for (auto& [k, v] : j.items()) {
      ordered_json value = std::move(v);
      MaskJson(value, nonce, markers);
      masked[MaskString(k, nonce, markers)] = std::move(value);
    }
    j = std::move(masked);
  }
}

ControlTextMask::Masked ControlTextMask::Mask(const std::vector<ChatMessage>& messages,
                                              const ordered_json& tools) const {
  Masked m;
  m.nonce = NewNonce();
  m.messages = messages;
  m.tools = tools;
  if (texts_.empty()) return m;
  for (ChatMessage& msg : m.messages) {
    msg.content = MaskString(msg.content, m.nonce, &m.markers);
    MaskJson(msg.extra, m.nonce, &m.markers);
  }
  MaskJson(m.tools, m.nonce, &m.markers);
  return m;
}

ControlTextMask::Prompt ControlTextMask::Unmask(const std::string& rendered,
                                                const Masked& masked) const {
  Prompt p;
  const std::string open = "@@" + masked.nonce + "#";
  size_t pos = 0;
  for (size_t m; (m = rendered.find(open, pos)) != std::string::npos;) {
    p.text.append(rendered, pos, m - pos);
    size_t end = m + open.size(), index = 0;
    while (end < rendered.size() && rendered[end] >= '0' && rendered[end] <= '9' &&
           index < texts_.size()) {
      index = index * 10 + static_cast<size_t>(rendered[end++] - '0');
    }
    if (end == m + open.size() || index >= texts_.size() || rendered.compare(end, 2, "@@") != 0) {
      CutMarker();
    }
    const std::string& text = texts_[index];
    p.literal.push_back({p.text.size(), p.text.size() + text.size()});
    p.text += text;
    pos = end + 2;
  }
  p.text.append(rendered, pos, std::string::npos);
  if (masked.markers > 0 && p.text.find(masked.nonce) != std::string::npos) CutMarker();
  return p;
}

}  // namespace meshnet::api

// meshnet tokenize / meshnet detokenize: a model's tokenizer on the command
// line (only the GGUF's tokenizer.* keys are read; no tensor is touched).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "gguf/gguf_reader.h"
#include "model/tokenizer.h"
#include "util/error.h"

namespace meshnet::cli {
namespace {

// Text files larger than this are refused (a prompt, not a corpus).
constexpr uint64_t kMaxInputBytes = 256ull << 20;

std::string ReadInput(const std::string& text, const std::string& path, const char* what) {
  if (!text.empty() && !path.empty()) {
    ThrowInvalidArgument(std::string("give either --") + what + " or --file, not both");
  }
  if (path.empty()) return text;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) ThrowInvalidArgument("cannot read --file '" + path + "'");
  const auto size = static_cast<uint64_t>(in.tellg());
  if (size > kMaxInputBytes) {
    ThrowInvalidArgument("--file '" + path + "' has " + std::to_string(size) +
                         " bytes; the limit is " + std::to_string(kMaxInputBytes));
  }
  std::string data(size, '\0');
  in.seekg(0);
  in.read(data.data(), static_cast<std::streamsize>(size));
  if (!in) ThrowInvalidArgument("cannot read --file '" + path + "'");
  return data;
}

void CheckOutput(const std::string& output) {
  if (output != "text" && output != "json") {
    ThrowInvalidArgument("--output must be text or json, got '" + output + "'");
  }
}

std::string Dump(const nlohmann::ordered_json& j) {
  // Byte-level pieces may be partial UTF-8: replaced by U+FFFD in JSON.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

struct TokenizeFlags {
  std::string model, text, file, output = "text";
  bool no_bos = false, special = false, verbose = false;
};

int RunTokenize(const TokenizeFlags& f) {
  CheckOutput(f.output);
  const std::string input = ReadInput(f.text, f.file, "text");
  const auto file = gguf::GgufFile::Open(f.model, gguf::GgufFile::Access::kSequential);
  const model::Tokenizer tok = model::Tokenizer::FromGguf(file);
  const std::vector<model::TokenId> ids = tok.Tokenize(input, !f.no_bos, f.special);
  // --verbose: each token's decoded piece (in context, so the pieces
  // concatenate to the decoded text; control tokens shown) and vocab text.
  std::vector<std::string> pieces;
  if (f.verbose) {
    model::TokenId prev = model::kNoToken;
    for (model::TokenId id : ids) {
      pieces.push_back(tok.DecodePiece(prev, id, /*render_special=*/true));
      prev = id;
    }
  }
  if (f.output == "json") {
    nlohmann::ordered_json out;
    out["ids"] = ids;
    if (f.verbose) {
      out["pieces"] = pieces;
      std::vector<std::string> texts;
      for (model::TokenId id : ids) texts.push_back(tok.TokenText(id));
      out["tokens"] = texts;
    }
    std::cout << Dump(out) << "\n";
  } else if (f.verbose) {
    for (size_t i = 0; i < ids.size(); ++i) {
      std::cout << ids[i] << "\t'" << pieces[i] << "'\t" << tok.TokenText(ids[i]) << "\n";
    }
  } else {
    std::string line;
    for (model::TokenId id : ids) line += (line.empty() ? "" : " ") + std::to_string(id);
    std::cout << line << "\n";
  }
  return 0;
}

struct DetokenizeFlags {
  std::string model, ids, file, output = "text";
  bool special = false;
};

std::vector<model::TokenId> ParseIds(const std::string& text) {
  std::string s = text;
  for (char& c : s) {
    if (c == ',' || c == '[' || c == ']') c = ' ';
  }
  std::istringstream in(s);
  std::vector<model::TokenId> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < INT32_MIN || v > INT32_MAX) {
      ThrowInvalidArgument("'" + word + "' is not a token id");
    }
    ids.push_back(static_cast<model::TokenId>(v));
  }
  return ids;
}

int RunDetokenize(const DetokenizeFlags& f) {
  CheckOutput(f.output);
  const std::vector<model::TokenId> ids = ParseIds(ReadInput(f.ids, f.file, "ids"));
  const auto file = gguf::GgufFile::Open(f.model, gguf::GgufFile::Access::kSequential);
  const model::Tokenizer tok = model::Tokenizer::FromGguf(file);
  const std::string text = tok.Decode(ids, f.special);  // throws on an id out of range
  if (f.output == "json") {
    nlohmann::ordered_json out;
    out["text"] = text;
    std::cout << Dump(out) << "\n";
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  }
  return 0;
}

void SetupTokenize(CLI::App* sub, int* exit_code) {
  auto f = std::make_shared<TokenizeFlags>();
  sub->add_option("--model,-m", f->model, "GGUF file whose tokenizer to use")->required();
  sub->add_option("--text,-t", f->text, "Text to tokenize");
  sub->add_option("--file,-f", f->file, "Read the text from this file (raw bytes, <= 256 MiB)");
  sub->add_flag("--no-bos", f->no_bos,
                "Add no BOS/EOS (default: as the model's add_bos/add_eos say)");
  sub->add_flag("--special", f->special,
                "Parse control tokens (e.g. <|im_start|>) in the text; user-defined tokens are "
                "always matched");
  sub->add_option("--output", f->output, "text (ids on one line) or json ({\"ids\":[...]})")
      ->capture_default_str();
  sub->add_flag("--verbose,-v", f->verbose,
                "Also print each token's decoded piece and vocabulary text (json: \"pieces\", "
                "\"tokens\")");
  sub->footer("Exit status: 0 on success, 2 for a bad flag value or a malformed GGUF.");
  sub->callback([f, exit_code] { *exit_code = RunTokenize(*f); });
}

void SetupDetokenize(CLI::App* sub, int* exit_code) {
  auto f = std::make_shared<DetokenizeFlags>();
  sub->add_option("--model,-m", f->model, "GGUF file whose tokenizer to use")->required();
  sub->add_option("--ids,-i", f->ids, "Token ids, separated by spaces or commas");
  sub->add_option("--file,-f", f->file, "Read the ids from this file");
  sub->add_flag("--special", f->special, "Render control tokens as their text");
  sub->add_option("--output", f->output, "text or json ({\"text\":...})")->capture_default_str();
  sub->footer("Exit status: 0 on success, 2 for a bad id, flag value or a malformed GGUF.");
  sub->callback([f, exit_code] { *exit_code = RunDetokenize(*f); });
}

const CommandRegistrar kTokenize({"tokenize", "Tokenize text with a model's tokenizer",
                                  SetupTokenize});
const CommandRegistrar kDetokenize({"detokenize", "Turn token ids back into text",
                                    SetupDetokenize});

}  // namespace
}  // namespace meshnet::cli

#include "model/hparams.h"

#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include "gguf/gguf_reader.h"

namespace meshnet::model {

namespace {

// A positive int from `key` (an integer of any stored width); nullopt when
// absent. Throws kMalformedFile on a non-positive or too large value.
std::optional<int> PositiveInt(const gguf::GgufFile& file, const std::string& key) {
  const std::optional<int64_t> v = file.GetI64(key);
  if (!v) return std::nullopt;
  if (*v <= 0 || *v > std::numeric_limits<int32_t>::max()) {
    throw Error(ErrorKind::kMalformedFile, file.name() + ": " + key + " = " + std::to_string(*v) +
                                               " must be a positive 32-bit integer");
  }
  return static_cast<int>(*v);
}

int RequirePositiveInt(const gguf::GgufFile& file, const std::string& key) {
  std::optional<int> v = PositiveInt(file, key);
  if (!v) throw Error(ErrorKind::kMalformedFile, file.name() + ": missing key '" + key + "'");
  return *v;
}

std::optional<float> FiniteFloat(const gguf::GgufFile& file, const std::string& key) {
  const std::optional<float> v = file.GetF32(key);
  if (v && !(std::isfinite(*v) && *v > 0.0f)) {
    throw Error(ErrorKind::kMalformedFile, file.name() + ": " + key + " = " + std::to_string(*v) +
                                               " must be finite and positive");
  }
  return v;
}

}  // namespace

LlamaHParams LlamaHParams::FromGguf(const gguf::GgufFile& file) {
  const std::string_view arch_name = file.RequireString(gguf_keys::kArchitecture);
  LlamaHParams hp;
  try {
    hp.arch = &CertifiedArchitectureFor(arch_name);
  } catch (const Error& e) {
    throw Error(e.kind(), file.name() + ": " + gguf_keys::kArchitecture + ": " + e.what());
  }
  const CertifiedArchitecture& a = *hp.arch;

  hp.n_embd = RequirePositiveInt(file, a.Key(ArchKey::kEmbeddingLength));
  hp.n_layers = RequirePositiveInt(file, a.Key(ArchKey::kBlockCount));
  hp.n_heads = RequirePositiveInt(file, a.Key(ArchKey::kHeadCount));
  hp.n_kv_heads = PositiveInt(file, a.Key(ArchKey::kHeadCountKv)).value_or(hp.n_heads);
  hp.n_ff = RequirePositiveInt(file, a.Key(ArchKey::kFeedForwardLength));
  hp.context_length = RequirePositiveInt(file, a.Key(ArchKey::kContextLength));
  if (hp.n_embd % hp.n_heads != 0) {
    throw Error(ErrorKind::kMalformedFile,
                file.name() + ": " + a.Key(ArchKey::kEmbeddingLength) + " = " +
                    std::to_string(hp.n_embd) + " is not a multiple of " +
                    a.Key(ArchKey::kHeadCount) + " = " + std::to_string(hp.n_heads));
  }
  hp.head_dim = hp.n_embd / hp.n_heads;
  hp.n_rot = PositiveInt(file, a.Key(ArchKey::kRopeDimensionCount)).value_or(hp.head_dim);
  hp.rope_freq_base = FiniteFloat(file, a.Key(ArchKey::kRopeFreqBase)).value_or(10000.0f);
  hp.rms_eps = FiniteFloat(file, a.Key(ArchKey::kRmsEpsilon)).value_or(1e-5f);

  const std::optional<int> declared_vocab = PositiveInt(file, a.Key(ArchKey::kVocabSize));
  const auto tokens = file.GetStringArray(gguf_keys::kTokens);
  if (tokens) {
    if (tokens->empty()) {
      throw Error(ErrorKind::kMalformedFile, file.name() + ": " + gguf_keys::kTokens + " is empty");
    }
    if (tokens->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      throw Error(ErrorKind::kMalformedFile,
                  file.name() + ": " + gguf_keys::kTokens + " is too large");
    }
    const int n_tokens = static_cast<int>(tokens->size());
    if (declared_vocab && *declared_vocab != n_tokens) {
      throw Error(ErrorKind::kMalformedFile, file.name() + ": " + a.Key(ArchKey::kVocabSize) +
                                                 " = " + std::to_string(*declared_vocab) + " but " +
                                                 gguf_keys::kTokens + " has " +
                                                 std::to_string(n_tokens) + " tokens");
    }
    hp.vocab_size = n_tokens;
  } else if (declared_vocab) {
    hp.vocab_size = *declared_vocab;
  } else {
    throw Error(ErrorKind::kMalformedFile, file.name() + ": no vocabulary size: neither '" +
                                               a.Key(ArchKey::kVocabSize) + "' nor '" +
                                               gguf_keys::kTokens + "' is present");
  }

  try {
    hp.Validate(ErrorKind::kMalformedFile);
  } catch (const Error& e) {
    throw Error(e.kind(), file.name() + ": " + e.what());
  }
  return hp;
}

void LlamaHParams::Validate(ErrorKind kind) const {
  auto fail = [kind](const std::string& message) { throw Error(kind, "hparams: " + message); };
  if (arch == nullptr) fail("no architecture");
  const struct {
    const char* name;
    int64_t value;
  } sizes[] = {{"n_embd", n_embd},
               {"n_layers", n_layers},
               {"n_heads", n_heads},
               {"n_kv_heads", n_kv_heads},
               {"n_ff", n_ff},
               {"head_dim", head_dim},
               {"n_rot", n_rot},
               {"context_length", context_length},
               {"vocab_size", vocab_size}};
  for (const auto& s : sizes) {
    if (s.value <= 0) fail(std::string(s.name) + " = " + std::to_string(s.value) + " must be > 0");
  }
  if (n_embd % n_heads != 0) {
    fail("n_embd = " + std::to_string(n_embd) +
         " is not a multiple of n_heads = " + std::to_string(n_heads));
  }
  if (head_dim != n_embd / n_heads) {
    fail("head_dim = " + std::to_string(head_dim) +
         " is not n_embd / n_heads = " + std::to_string(n_embd / n_heads));
  }
  if (n_heads % n_kv_heads != 0) {
    fail("n_heads = " + std::to_string(n_heads) +
         " is not a multiple of n_kv_heads = " + std::to_string(n_kv_heads));
  }
  if (n_rot % 2 != 0 || n_rot > head_dim) {
    fail("rope dimension count n_rot = " + std::to_string(n_rot) +
         " must be even and <= head_dim = " + std::to_string(head_dim));
  }
  if (!(std::isfinite(rope_freq_base) && rope_freq_base > 0.0f)) {
    fail("rope_freq_base = " + std::to_string(rope_freq_base) + " must be finite and positive");
  }
  if (!(std::isfinite(rms_eps) && rms_eps > 0.0f)) {
    fail("rms_eps = " + std::to_string(rms_eps) + " must be finite and positive");
  }
}

void LlamaHParams::ValidateLayerRange(int start_layer, int end_layer) const {
  if (start_layer < 0 || start_layer > end_layer || end_layer >= n_layers) {
    ThrowInvalidArgument("layer range " + std::to_string(start_layer) + "-" +
                         std::to_string(end_layer) + " is not within 0-" +
                         std::to_string(n_layers - 1) + " (start <= end, both inclusive)");
  }
}

std::string LlamaHParams::ToString() const {
  std::ostringstream os;
  os << (arch ? arch->adapter : "?") << ": n_embd=" << n_embd << " n_layers=" << n_layers
     << " n_heads=" << n_heads << " n_kv_heads=" << n_kv_heads << " n_ff=" << n_ff
     << " head_dim=" << head_dim << " n_rot=" << n_rot << " rope_freq_base=" << rope_freq_base
     << " rms_eps=" << rms_eps << " context_length=" << context_length
     << " vocab_size=" << vocab_size;
  return os.str();
}

}  // namespace meshnet::model

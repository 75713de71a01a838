// Random-weight model generator. Each tensor's values come from its own PRNG
// stream, seeded from (seed, tensor name), so the output does not depend on
// the order tensors are generated in, and a tensor is produced row by row
// straight into the writer's buffer (float row -> QuantizeRow).
#include "gguf/make_model.h"

#include <cmath>
#include <cstring>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "arch/architecture.h"
#include "ops/quantize.h"
#include "util/error.h"

namespace meshnet::gguf {

namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Standard normal samples (Box-Muller over a SplitMix64 stream).
class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : state_(seed) {}
  float Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1], u2 in [0, 1).
    const double u1 = (static_cast<double>(SplitMix64(&state_) >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(SplitMix64(&state_) >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = static_cast<float>(r * std::sin(2.0 * std::numbers::pi * u2));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(2.0 * std::numbers::pi * u2));
  }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  float spare_ = 0;
};

uint64_t TensorSeed(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  uint64_t s = seed ^ h;
  return SplitMix64(&s);
}

// llama.cpp's general.file_type (llama_ftype) for a weight type.
uint32_t FileType(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ4_0:
      return 2;
    case GgmlType::kQ4_1:
      return 3;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kQ5_0:
      return 8;
    case GgmlType::kQ5_1:
      return 9;
    case GgmlType::kQ2_K:
      return 10;
    case GgmlType::kQ3_K:
      return 12;  // Q3_K_M
    case GgmlType::kQ4_K:
      return 15;  // Q4_K_M
    case GgmlType::kQ5_K:
      return 17;  // Q5_K_M
    case GgmlType::kQ6_K:
      return 18;
    case GgmlType::kIQ4_NL:
      return 25;
    case GgmlType::kIQ4_XS:
      return 30;
    case GgmlType::kBF16:
      return 32;
  }
  return 0;
}

void CheckRange(const char* flag, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    ThrowInvalidArgument(std::string(flag) + " " + std::to_string(v) + " is outside [" +
                         std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
}

void CheckBlock(const char* flag, int64_t v, GgmlType t, const char* type_flag) {
  const GgmlTypeInfo info = GgmlTypeInfoOf(t);
  if (v % info.block_elems != 0) {
    ThrowInvalidArgument(std::string(flag) + " " + std::to_string(v) +
                         " is not a multiple of the " + std::string(info.name) + " block size " +
                         std::to_string(info.block_elems) + " (" + type_flag + ")");
  }
}

}  // namespace

std::vector<float> Llama3RopeFactors(int64_t n_rot, float base) {
  constexpr double kFactor = 8, kLowFreqFactor = 1, kHighFreqFactor = 4, kOldContext = 8192;
  const double low_freq_wavelen = kOldContext / kLowFreqFactor;
  const double high_freq_wavelen = kOldContext / kHighFreqFactor;
  std::vector<float> factors;
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const double freq = std::pow(static_cast<double>(base), -2.0 * i / static_cast<double>(n_rot));
    const double wavelen = 2 * M_PI / freq;
    double f = 1;
    if (wavelen > low_freq_wavelen) {
      f = kFactor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth =
          (kOldContext / wavelen - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
      f = 1 / ((1 - smooth) / kFactor + smooth);
    }
    factors.push_back(static_cast<float>(f));
  }
  return factors;
}

void ValidateMakeModelOptions(const MakeModelOptions& o) {
  if (!FindCertifiedArchitecture(o.architecture)) {
    (void)CertifiedArchitectureFor(o.architecture);  // throws, naming the certified set
  }
  CheckRange("--n-embd", o.n_embd, 1, 65536);
  CheckRange("--n-layers", o.n_layers, 1, 1024);
  CheckRange("--n-heads", o.n_heads, 1, 1024);
  CheckRange("--n-kv-heads", o.n_kv_heads, 1, 1024);
  CheckRange("--n-ff", o.n_ff, 1, 262144);
  CheckRange("--context", o.context, 1, int64_t{1} << 24);
  if (o.n_embd % o.n_heads != 0) {
    ThrowInvalidArgument("--n-embd " + std::to_string(o.n_embd) +
                         " is not divisible by --n-heads " + std::to_string(o.n_heads));
  }
  if (o.n_heads % o.n_kv_heads != 0) {
    ThrowInvalidArgument("--n-heads " + std::to_string(o.n_heads) +
                         " is not divisible by --n-kv-heads " + std::to_string(o.n_kv_heads));
  }
  if ((o.n_embd / o.n_heads) % 2 != 0) {
    ThrowInvalidArgument("head dimension --n-embd / --n-heads = " +
                         std::to_string(o.n_embd / o.n_heads) + " must be even (RoPE pairs)");
  }
  CheckBlock("--n-embd", o.n_embd, o.type, "--type");
  CheckBlock("--n-ff", o.n_ff, o.type, "--type");
  for (GgmlType t : o.mix_types) {
    CheckBlock("--n-embd", o.n_embd, t, "--type");
    CheckBlock("--n-ff", o.n_ff, t, "--type");
  }
  if (o.embedding_type) CheckBlock("--n-embd", o.n_embd, *o.embedding_type, "--embd-type");
  if (!(o.rope_base > 0.0f) || !std::isfinite(o.rope_base)) {
    ThrowInvalidArgument("--rope-base must be a positive finite number");
  }
  if (!(o.rms_eps > 0.0f) || !std::isfinite(o.rms_eps)) {
    ThrowInvalidArgument("rms epsilon must be a positive finite number");
  }
}

// general.* and the architecture's hyper-parameter keys.
void WriteHParams(const MakeModelOptions& o, const CertifiedArchitecture& arch, int64_t vocab_size,
                  GgufWriter* w) {
  const int64_t head_dim = o.n_embd / o.n_heads;
  w->SetString(gguf_keys::kArchitecture, arch.gguf_arch);
  w->SetString(gguf_keys::kName, o.name);
  w->SetU32(gguf_keys::kFileType, FileType(o.type));
  // The seed makes two random models of one shape distinguishable by their
  // metadata (a node's model identity hashes the header, not the weights).
  w->SetU64("meshnet.make_model.seed", o.seed);
  w->SetU32(arch.Key(ArchKey::kContextLength), static_cast<uint32_t>(o.context));
  w->SetU32(arch.Key(ArchKey::kEmbeddingLength), static_cast<uint32_t>(o.n_embd));
  w->SetU32(arch.Key(ArchKey::kBlockCount), static_cast<uint32_t>(o.n_layers));
  w->SetU32(arch.Key(ArchKey::kFeedForwardLength), static_cast<uint32_t>(o.n_ff));
  w->SetU32(arch.Key(ArchKey::kHeadCount), static_cast<uint32_t>(o.n_heads));
  w->SetU32(arch.Key(ArchKey::kHeadCountKv), static_cast<uint32_t>(o.n_kv_heads));
  w->SetF32(arch.Key(ArchKey::kRmsEpsilon), o.rms_eps);
  w->SetF32(arch.Key(ArchKey::kRopeFreqBase), o.rope_base);
  w->SetU32(arch.Key(ArchKey::kRopeDimensionCount), static_cast<uint32_t>(head_dim));
  w->SetU32(arch.Key(ArchKey::kVocabSize), static_cast<uint32_t>(vocab_size));
}

namespace {

// Adds a model's tensors to a writer in GGUF order, counting them.
class TensorAdder {
 public:
  TensorAdder(const MakeModelOptions& o, GgufWriter* w, MakeModelSummary* summary)
      : o_(o), w_(w), summary_(summary) {}

  // A matrix (rows of ne0 values) of `type`, N(0, (scale/sqrt(ne0))^2).
  void Matrix(const std::string& name, GgmlType type, int64_t ne0, int64_t ne1, double scale) {
    const int64_t dims[] = {ne0, ne1};
    const float std_dev = static_cast<float>(scale / std::sqrt(static_cast<double>(ne0)));
    const uint64_t seed = o_.seed;
    w_->AddTensor(name, type, dims, [name, type, ne0, ne1, std_dev, seed](std::span<uint8_t> dst) {
      NormalRng rng(TensorSeed(seed, name));
      std::vector<float> row(static_cast<size_t>(ne0));  // (ne0)
      const int64_t row_bytes = ops::RowBytes(type, ne0);
      for (int64_t r = 0; r < ne1; ++r) {
        for (float& x : row) x = rng.Next() * std_dev;
        ops::QuantizeRow(type, row.data(), ne0, dst.data() + r * row_bytes);
      }
    });
    Count(ne0 * ne1);
  }
  // An RMS-norm weight of ones.
  void Norm(const std::string& name) {
    const int64_t dims[] = {o_.n_embd};
    w_->AddTensor(name, GgmlType::kF32, dims, [](std::span<uint8_t> dst) {
      const float one = 1.0f;
      for (size_t i = 0; i + 4 <= dst.size(); i += 4) std::memcpy(dst.data() + i, &one, 4);
    });
    Count(o_.n_embd);
  }
  void Vector(const std::string& name, std::vector<float> values) {
    const int64_t dims[] = {static_cast<int64_t>(values.size())};
    Count(dims[0]);
    w_->AddTensor(name, GgmlType::kF32, dims, [values = std::move(values)](std::span<uint8_t> dst) {
      std::memcpy(dst.data(), values.data(), values.size() * sizeof(float));
    });
  }
  // A bias vector of n values, N(0, 0.5^2).
  void RandomVector(const std::string& name, int64_t n) {
    NormalRng rng(TensorSeed(o_.seed, name));
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = rng.Next() * 0.5f;
    Vector(name, std::move(v));
  }
  // The weight type of the next matrix: --type, or the next of --mix-types in turn.
  GgmlType NextMatrixType() {
    return o_.mix_types.empty() ? o_.type : o_.mix_types[next_mix_++ % o_.mix_types.size()];
  }

 private:
  void Count(int64_t n_params) {
    summary_->n_params += n_params;
    ++summary_->n_tensors;
  }

  const MakeModelOptions& o_;
  GgufWriter* w_;
  MakeModelSummary* summary_;
  size_t next_mix_ = 0;
};

// One transformer block's tensors, in llama.cpp's order.
void AddLayer(const MakeModelOptions& o, const CertifiedArchitecture& arch, int layer,
              TensorAdder& add) {
  const int64_t n_embd_kv = o.n_embd / o.n_heads * o.n_kv_heads;
  const double residual_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(o.n_layers));
  auto name = [layer](LayerTensor t) { return CertifiedArchitecture::LayerTensorName(layer, t); };
  add.Norm(name(LayerTensor::kAttnNorm));
  add.Matrix(name(LayerTensor::kAttnQ), add.NextMatrixType(), o.n_embd, o.n_embd, 1.0);
  add.Matrix(name(LayerTensor::kAttnK), add.NextMatrixType(), o.n_embd, n_embd_kv, 1.0);
  add.Matrix(name(LayerTensor::kAttnV), add.NextMatrixType(), o.n_embd, n_embd_kv, 1.0);
  if (arch.qkv_bias) {
    for (auto [t, n] :
         {std::pair{LayerTensor::kAttnQ, o.n_embd}, std::pair{LayerTensor::kAttnK, n_embd_kv},
          std::pair{LayerTensor::kAttnV, n_embd_kv}}) {
      add.RandomVector(CertifiedArchitecture::LayerBiasName(layer, t), n);
    }
  }
  add.Matrix(name(LayerTensor::kAttnOutput), add.NextMatrixType(), o.n_embd, o.n_embd,
             residual_scale);
  add.Norm(name(LayerTensor::kFfnNorm));
  add.Matrix(name(LayerTensor::kFfnGate), add.NextMatrixType(), o.n_embd, o.n_ff, 1.0);
  add.Matrix(name(LayerTensor::kFfnUp), add.NextMatrixType(), o.n_embd, o.n_ff, 1.0);
  add.Matrix(name(LayerTensor::kFfnDown), add.NextMatrixType(), o.n_ff, o.n_embd, residual_scale);
}

}  // namespace

MakeModelSummary BuildModel(const MakeModelOptions& o, const GgufFile& tokenizer, GgufWriter* w) {
  ValidateMakeModelOptions(o);
  const CertifiedArchitecture& arch = CertifiedArchitectureFor(o.architecture);
  const auto tokens = tokenizer.GetStringArray(gguf_keys::kTokens);
  if (!tokens || tokens->empty()) {
    ThrowInvalidArgument("--tokenizer-from " + tokenizer.name() + " has no " + gguf_keys::kTokens +
                         " array");
  }
  MakeModelSummary summary;
  summary.vocab_size = static_cast<int64_t>(tokens->size());
  WriteHParams(o, arch, summary.vocab_size, w);
  for (const MetadataEntry& e : tokenizer.metadata()) {
    if (e.key.starts_with("tokenizer.")) w->Set(e.key, WriterValue::From(e.value));
  }

  TensorAdder add(o, w, &summary);
  add.Matrix(CertifiedArchitecture::kTokenEmbedding,
             o.embedding_type.value_or(add.NextMatrixType()), o.n_embd, summary.vocab_size, 1.0);
  for (int layer = 0; layer < o.n_layers; ++layer) AddLayer(o, arch, layer, add);
  add.Norm(CertifiedArchitecture::kOutputNorm);
  if (!o.tie_output) {
    add.Matrix(CertifiedArchitecture::kOutput, add.NextMatrixType(), o.n_embd, summary.vocab_size,
               1.0);
  }
  if (o.rope_freqs) {
    add.Vector(CertifiedArchitecture::kRopeFreqs,
               Llama3RopeFactors(o.n_embd / o.n_heads, o.rope_base));
  }
  return summary;
}

MakeModelSummary MakeModel(const MakeModelOptions& o, const std::string& tokenizer_path,
                           const std::string& out_path) {
  ValidateMakeModelOptions(o);
  GgufWriter w;
  MakeModelSummary summary;
  {
    const GgufFile tokenizer = GgufFile::Open(tokenizer_path, GgufFile::Access::kSequential);
    summary = BuildModel(o, tokenizer, &w);
  }
  w.WriteFile(out_path);
  summary.file_bytes = GgufFile::Open(out_path).file_size();  // re-read: validates the output
  return summary;
}

}  // namespace meshnet::gguf

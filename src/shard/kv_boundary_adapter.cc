#include "shard/kv_boundary_adapter.h"

#include <string>
#include <utility>

#include "util/error.h"

namespace meshnet::shard {

namespace {
[[noreturn]] void Contract(const std::string& message) {
  throw Error(ErrorKind::kBoundaryContract, message);
}
}  // namespace

KvBoundaryAdapter::KvBoundaryAdapter(const LlamaShard* shard, kv::HotKvStateManager* manager)
    : shard_(shard),
      manager_(manager),
      role_(shard->role()),
      recipe_(shard->MakeRecipe(manager->recipe().kv_dtype)) {
  if (!manager_->recipe().IsCompatible(recipe_)) {
    throw Error(ErrorKind::kIncompatibleRecipe,
                "manager recipe " + manager_->recipe().Fingerprint() +
                    " does not match this computation's KV recipe " + recipe_.Fingerprint());
  }
}

BeginResult KvBoundaryAdapter::BeginPrefill(std::string_view session_id, int64_t route_epoch,
                                            const StepInput& input,
                                            const SamplingContract& sampling) {
  // Validate the input before Open() replaces anything: a contract violation
  // must leave the node's state as it was.
  Validate(input.token_ids, input.bundle, 0, sampling);
  manager_->Open(session_id, route_epoch, &recipe_);
  return Begin(session_id, route_epoch, input, 0, sampling);
}

BeginResult KvBoundaryAdapter::BeginDecode(std::string_view session_id, int64_t route_epoch,
                                           const StepInput& input,
                                           std::optional<int64_t> expected_seq_len,
                                           const SamplingContract& sampling) {
  return Begin(session_id, route_epoch, input, expected_seq_len, sampling);
}

StepOutput KvBoundaryAdapter::Prefill(std::string_view session_id, int64_t route_epoch,
                                      const StepInput& input, const SamplingContract& sampling) {
  return Run(BeginPrefill(session_id, route_epoch, input, sampling));
}

StepOutput KvBoundaryAdapter::Decode(std::string_view session_id, int64_t route_epoch,
                                     const StepInput& input,
                                     std::optional<int64_t> expected_seq_len,
                                     const SamplingContract& sampling) {
  return Run(BeginDecode(session_id, route_epoch, input, expected_seq_len, sampling));
}

StepOutput KvBoundaryAdapter::Run(BeginResult begun) {
  if (auto* miss = std::get_if<kv::CacheMiss>(&begun)) return std::move(*miss);
  PendingStep& p = std::get<PendingStep>(begun);
  shard_->Forward(p.hidden.data(), p.n_new, p.step);
  return Finish(p);
}

int64_t KvBoundaryAdapter::Validate(std::optional<std::span<const int32_t>> token_ids,
                                    const BoundaryBundle* bundle,
                                    std::optional<int64_t> expected_seq_len,
                                    const SamplingContract& sampling) const {
  const model::LlamaHParams& hp = shard_->hparams();
  int64_t n_new = 0;
  if (role_.is_head()) {
    if (!token_ids) Contract("the head owns token embedding and must receive token IDs");
    if (bundle != nullptr) {
      Contract(
          "the head owns token embedding; it must not receive a boundary bundle from an "
          "upstream range");
    }
    n_new = static_cast<int64_t>(token_ids->size());
    if (n_new == 0) Contract("a step must carry at least one token");
    for (int32_t id : *token_ids) {
      if (id < 0 || id >= hp.vocab_size) {
        ThrowInvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                             std::to_string(hp.vocab_size - 1) + ")");
      }
    }
  } else {
    if (token_ids) {
      Contract(
          "middle/tail shards bypass token embedding; they take a boundary bundle, not token "
          "IDs");
    }
    if (bundle == nullptr) Contract("middle/tail shards must receive the boundary bundle");
    // Positions are checked against the start the caller claims; a decode
    // without expected_seq_len is checked again once the step is reserved.
    const int64_t claimed_start = expected_seq_len
                                      ? *expected_seq_len
                                      : (bundle->positions.empty() ? 0 : bundle->positions[0]);
    CheckBoundary(*bundle, arch(), role_.start_layer, hp.n_embd, claimed_start);
    n_new = bundle->n_tokens;
  }
  if (role_.is_tail()) sampling.Validate();
  CheckContext(expected_seq_len.value_or(0), n_new);
  return n_new;
}

void KvBoundaryAdapter::CheckContext(int64_t start, int64_t n_new) const {
  const int64_t ctx = shard_->hparams().context_length;
  if (n_new > ctx - start) {
    ThrowInvalidArgument(
        "positions " + std::to_string(start) + ".." + std::to_string(start + n_new - 1) +
        " exceed the model's context length of " + std::to_string(ctx) + " tokens");
  }
}

BeginResult KvBoundaryAdapter::Begin(std::string_view session_id, int64_t route_epoch,
                                     const StepInput& input,
                                     std::optional<int64_t> expected_seq_len,
                                     const SamplingContract& sampling) {
  const int64_t n_embd = shard_->hparams().n_embd;
  // 1. The boundary contract, checked before the KV state is touched.
  const int64_t n_new = Validate(input.token_ids, input.bundle, expected_seq_len, sampling);

  // 2. Reserve rows (resolve + budget); a gone state is an explicit miss.
  if (input.rewind && expected_seq_len) {
    try {
      manager_->Truncate(session_id, route_epoch, *expected_seq_len);
    } catch (const Error&) {
      // A gone or stale state: BeginStep answers it as usual.
    }
  }
  kv::StepResult begun =
      manager_->BeginStep(session_id, route_epoch, n_new, &recipe_, expected_seq_len);
  if (auto* miss = std::get_if<kv::CacheMiss>(&begun)) return std::move(*miss);
  PendingStep p;
  p.step = std::move(std::get<kv::KvStep>(begun));
  p.n_new = n_new;
  p.sampling = sampling;
  p.verify = input.verify;
  const int64_t start = p.step.start_pos();
  CheckContext(start, n_new);  // not committed: the reserved rows are given back
  if (!role_.is_head() && input.bundle->positions[0] != start) {
    Contract("boundary positions start at " + std::to_string(input.bundle->positions[0]) +
             " but this shard holds " + std::to_string(start) + " positions");
  }

  // 3. The residual (n_new, n_embd) the layers compute in place.
  if (role_.is_head()) {
    p.hidden.resize(static_cast<size_t>(n_new * n_embd));
    shard_->Embed(*input.token_ids, p.hidden.data());
  } else {
    p.hidden = std::move(input.bundle->residual);
    input.bundle->residual.clear();
  }
  return p;
}

TailOutput KvBoundaryAdapter::VerifyRows(PendingStep& p) const {
  const int64_t vocab = shard_->hparams().vocab_size;
  const int64_t start = p.step.start_pos();
  std::vector<float> all(static_cast<size_t>(p.n_new * vocab));
  shard_->LogitsRows(p.hidden.data(), p.n_new, all.data());
  TailOutput out;
  out.row_tokens.resize(static_cast<size_t>(p.n_new));
  for (int64_t i = 0; i < p.n_new; ++i) {
    const std::span<const float> row(all.data() + i * vocab, static_cast<size_t>(vocab));
    out.row_tokens[static_cast<size_t>(i)] = p.sampling.Sample(row, start + i + 1);
  }
  out.logits.assign(all.end() - vocab, all.end());
  out.token_id = out.row_tokens.back();
  return out;
}

StepOutput KvBoundaryAdapter::Finish(PendingStep& p) const {
  const model::LlamaHParams& hp = shard_->hparams();
  const int64_t n_embd = hp.n_embd;
  const int64_t start = p.step.start_pos();
  const int64_t n_new = p.n_new;
  // 4. Publish the new K/V; the state may have died meanwhile.
  if (std::optional<kv::CacheMiss> miss = p.step.Commit()) return std::move(*miss);

  if (role_.is_tail()) {
    // Only the last row reaches the head (prunes_rows_at_tail); the final norm
    // is applied inside Logits (normalizes_before_head).
    TailOutput out;
    if (p.verify) return VerifyRows(p);
    if (!p.logits_ready) {
      p.logits.resize(hp.vocab_size);
      shard_->Logits(p.hidden.data() + (n_new - 1) * n_embd, p.logits.data());
    }
    out.logits = std::move(p.logits);
    out.token_id = p.sampling.Sample(out.logits, start + n_new);
    return out;
  }
  BoundaryBundle out;
  out.architecture_adapter = arch().adapter;
  out.schema_version = arch().boundary_schema_version;
  out.tensor_name = arch().boundary_tensor_name;
  out.n_tokens = n_new;
  out.n_embd = n_embd;
  out.residual = std::move(p.hidden);
  out.positions.resize(n_new);
  for (int64_t i = 0; i < n_new; ++i) out.positions[i] = start + i;
  out.next_layer = role_.end_layer + 1;
  out.normalized = false;
  return out;
}

}  // namespace meshnet::shard

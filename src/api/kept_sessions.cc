#include "api/kept_sessions.h"

#include <algorithm>
#include <utility>

namespace meshnet::api {

void ReleaseKept(const KeptSession& s) {
  for (const auto& hop : s.hops) hop->Release(s.session_id, s.session_secret, s.epoch);
}

KeptSessions::~KeptSessions() {
  std::list<KeptSession> all;
  {
    MutexLock lock(&mu_);
    all.swap(lru_);
  }
  for (const KeptSession& s : all) ReleaseKept(s);  // RPCs: outside the lock
}

std::optional<KeptSession> KeptSessions::Take(const std::string& salt,
                                              std::span<const int32_t> prompt, int64_t* shared) {
  *shared = 0;
  MutexLock lock(&mu_);
  auto best = lru_.end();
  int64_t best_len = kMinSharedTokens - 1;
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->salt != salt) continue;
    const size_t n = std::min(prompt.size(), it->tokens.size());
    const auto len = static_cast<int64_t>(
        std::mismatch(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(n),
                      it->tokens.begin())
            .first -
        prompt.begin());
    if (len > best_len) {
      best = it;
      best_len = len;
    }
  }
  if (best == lru_.end()) return std::nullopt;
  KeptSession s = std::move(*best);
  lru_.erase(best);
  *shared = best_len;
  return s;
}

void KeptSessions::Put(KeptSession s) {
  std::vector<KeptSession> evicted;
  {
    MutexLock lock(&mu_);
    if (s.tokens.empty() || capacity_ <= 0) {
      evicted.push_back(std::move(s));
    } else {
      lru_.push_front(std::move(s));
    }
    while (static_cast<int64_t>(lru_.size()) > capacity_) {
      evicted.push_back(std::move(lru_.back()));
      lru_.pop_back();
    }
  }
  for (const KeptSession& e : evicted) ReleaseKept(e);  // RPCs: outside the lock
}

int64_t KeptSessions::size() const {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(lru_.size());
}

}  // namespace meshnet::api

// KeptSessions: the front door's prefix cache (issue 34, first part). A
// generation's session is not released when it ends: its KV stays on every
// hop of its route, and the text it covers (prompt + the generated tokens fed
// back) is remembered here. A later request whose prompt starts with part of
// that text (the next turn of a chat, another completion of one prompt)
// takes the session, truncates every hop to the shared part and computes
// only the rest (mesh::GenerateOptions::resume_length).
//
// Isolation: a session is taken by one request at a time (Take removes it),
// only by a request of the same cache salt (`cache_salt` in the request), and
// only when it shares at least kMinSharedTokens with the prompt. The hops
// keep their own rules: a kept session is an idle session there, evicted
// (LRU, budget, TTL) before live ones, and a resume whose session is gone
// prefills the whole prompt: never a wrong token.
//
// Bounds: at most `capacity` sessions are kept; beyond it the least recently
// used one is released on its hops (outside the lock).
//
// Thread-safety: every method is thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mesh/endpoint.h"
#include "util/mutex.h"

namespace meshnet::api {

struct KeptSession {
  std::string salt;
  std::vector<int32_t> tokens;  // whose KV the hops hold
  std::string session_id;
  std::string session_secret;
  int64_t epoch = 0;
  std::vector<std::shared_ptr<mesh::ShardEndpoint>> hops;
};

// Releases `s` on each of its hops (best effort).
void ReleaseKept(const KeptSession& s);

class KeptSessions {
 public:
  static constexpr int64_t kMinSharedTokens = 8;

  explicit KeptSessions(int capacity) : capacity_(capacity) {}
  ~KeptSessions();  // releases every kept session
  KeptSessions(const KeptSessions&) = delete;
  KeptSessions& operator=(const KeptSessions&) = delete;

  // The kept session of `salt` sharing the longest prefix with `prompt` (at
  // least kMinSharedTokens), removed from the store; *shared = that length.
  std::optional<KeptSession> Take(const std::string& salt, std::span<const int32_t> prompt,
                                  int64_t* shared);
  // Keeps `s` (most recently used); releases the least recently used beyond
  // the capacity. A session covering no token is released at once.
  void Put(KeptSession s);
  int64_t size() const;

 private:
  const int capacity_;
  mutable Mutex mu_;
  std::list<KeptSession> lru_ GUARDED_BY(mu_);  // most recently used first
};

}  // namespace meshnet::api

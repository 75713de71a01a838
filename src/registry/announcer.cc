#include "registry/announcer.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "util/error.h"

namespace meshnet::registry {

Announcer::Announcer(Registry* registry, std::function<NodeRecord()> describe, double ttl_s)
    : registry_(registry), describe_(std::move(describe)), ttl_s_(ttl_s) {
  if (!(ttl_s > 0 && ttl_s <= 86400)) ThrowInvalidArgument("--lease-ttl must be in (0, 86400]");
}

Announcer::~Announcer() { Stop(); }

void Announcer::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Announcer::Stop() {
  {
    MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void Announcer::SetDraining(bool draining) {
  MutexLock lock(&mu_);
  draining_ = draining;
  beat_now_ = true;
  wake_.SignalAll();
}

int64_t Announcer::announcements() const {
  MutexLock lock(&mu_);
  return announcements_;
}

bool Announcer::registered() const {
  MutexLock lock(&mu_);
  return registered_;
}

bool Announcer::Beat(LeaseId& lease) {
  NodeRecord r = describe_();
  {
    MutexLock lock(&mu_);
    r.draining = r.draining || draining_;
  }
  try {
    if (lease != 0 && registry_->Renew(lease, r)) return true;
    if (lease != 0) spdlog::warn("event=lease_lost registry={} lease={}", registry_->name(), lease);
    lease = registry_->Announce(r, ttl_s_);
    MutexLock lock(&mu_);
    ++announcements_;
    spdlog::info("event=announced registry={} lease={} ttl_s={}", registry_->name(), lease, ttl_s_);
    return true;
  } catch (const Error& e) {
    spdlog::warn("event=registry_unreachable registry={} kind={} message=\"{}\"", registry_->name(),
                 ErrorKindName(e.kind()), e.what());
    return false;
  }
}

void Announcer::Run() {
  LeaseId lease = 0;
  const auto period = std::chrono::duration<double>(ttl_s_ / 3);
  while (true) {
    const bool ok = Beat(lease);
    MutexLock lock(&mu_);
    registered_ = ok;
    const auto next = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    while (!stop_ && !beat_now_ && std::chrono::steady_clock::now() < next) wake_.WaitUntil(next);
    beat_now_ = false;
    if (stop_) break;
  }
  if (lease == 0) return;
  try {
    registry_->Withdraw(lease);
  } catch (const Error& e) {
    spdlog::warn("event=withdraw_failed registry={} message=\"{}\"", registry_->name(), e.what());
  }
}

}  // namespace meshnet::registry

#include "registry/announcer.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "util/error.h"

namespace meshnet::registry {

Announcer::Announcer(Registry* registry, std::function<NodeRecord(bool)> describe, double ttl_s)
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

bool Announcer::SetDraining(bool draining, double wait_s) {
  MutexLock lock(&mu_);
  draining_ = draining;
  beat_now_ = true;
  const int64_t wanted = beats_started_ + 1;  // the next beat reads the new flag
  wake_.SignalAll();
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(wait_s));
  while (!stop_ && beats_done_ < wanted && std::chrono::steady_clock::now() < until) {
    wake_.WaitUntil(until);
  }
  return beats_done_ >= wanted && registered_;
}

int64_t Announcer::announcements() const {
  MutexLock lock(&mu_);
  return announcements_;
}

bool Announcer::registered() const {
  MutexLock lock(&mu_);
  return registered_;
}

bool Announcer::Beat(Lease& lease, bool draining) {
  try {
    const NodeRecord r = describe_(draining);
    if (lease.id != 0 && registry_->Renew(lease, r)) return true;
    if (lease.id != 0) {
      spdlog::warn("event=lease_lost registry={} lease={}", registry_->name(), lease.id);
    }
    lease = registry_->Announce(r, ttl_s_);
    MutexLock lock(&mu_);
    ++announcements_;
    period_s_ = lease.ttl_s / 3;
    spdlog::info("event=announced registry={} lease={} ttl_s={}", registry_->name(), lease.id,
                 lease.ttl_s);
    return true;
  } catch (const Error& e) {
    spdlog::warn("event=registry_unreachable registry={} kind={} message=\"{}\"", registry_->name(),
                 ErrorKindName(e.kind()), e.what());
    return false;
  }
}

void Announcer::Run() {
  Lease lease;
  while (true) {
    bool draining = false;
    int64_t beat = 0;
    {
      MutexLock lock(&mu_);
      draining = draining_;
      beat = ++beats_started_;
    }
    const bool ok = Beat(lease, draining);
    MutexLock lock(&mu_);
    registered_ = ok;
    beats_done_ = beat;
    wake_.SignalAll();
    const double period = period_s_ > 0 ? period_s_ : ttl_s_ / 3;
    const auto next = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(period));
    while (!stop_ && !beat_now_ && std::chrono::steady_clock::now() < next) wake_.WaitUntil(next);
    beat_now_ = false;
    if (stop_) break;
  }
  if (lease.id == 0) return;
  try {
    registry_->Withdraw(lease);
  } catch (const Error& e) {
    spdlog::warn("event=withdraw_failed registry={} message=\"{}\"", registry_->name(), e.what());
  }
}

}  // namespace meshnet::registry

// The API server's Prometheus metrics (prometheus-cpp core, text format):
//   meshnet_api_requests_total{endpoint,status}
//   meshnet_api_prompt_tokens_total, meshnet_api_completion_tokens_total,
//   meshnet_api_prompt_tokens_cached_total
//   meshnet_api_route_passes_total, meshnet_api_route_seconds_total,
//   meshnet_api_route_compute_seconds_total (hops' compute, chain only),
//   meshnet_api_draft_tokens_total, meshnet_api_draft_tokens_accepted_total
//   meshnet_api_time_to_first_token_seconds (histogram)
//   meshnet_api_inter_token_latency_seconds (histogram)
//   meshnet_api_requests_in_flight, meshnet_api_requests_queued (gauges)
//
// Thread-safety: all methods are safe from any thread (prometheus-cpp
// metrics are atomic; the label lookup is guarded by the family).
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace prometheus {
class Registry;
class Counter;
class Histogram;
class Gauge;
template <typename T>
class Family;
}  // namespace prometheus

namespace meshnet::api {

class ApiMetrics {
 public:
  ApiMetrics();
  ~ApiMetrics();

  void CountRequest(const std::string& endpoint, int status);
  void AddTokens(int prompt_tokens, int completion_tokens);
  // Prompt tokens whose KV a kept session held (the prefix cache).
  void AddCachedTokens(int64_t tokens);
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  // A generation's route passes (mesh::GenerateResult): their count and wall
  // time, the hops' compute in those that said it, drafts sent and accepted.
  struct RouteUse {
    int64_t passes = 0;
    double seconds = 0;
    double compute_seconds = 0;
    int64_t drafted = 0;
    int64_t accepted = 0;
  };
  void AddRouteUse(const RouteUse& use);
  // Prometheus text exposition, with the gauges set to these values.
  std::string Render(int in_flight, int queued);
  // Text appended to every Render (e.g. the registry route costs); set before serving.
  void SetExtra(std::function<std::string()> extra) { extra_ = std::move(extra); }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* completion_tokens_;
  prometheus::Counter* cached_tokens_;
  prometheus::Counter* route_passes_;
  prometheus::Counter* route_seconds_;
  prometheus::Counter* route_compute_seconds_;
  prometheus::Counter* drafted_;
  prometheus::Counter* accepted_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Gauge* in_flight_;
  prometheus::Gauge* queued_;
  std::function<std::string()> extra_;
};

}  // namespace meshnet::api

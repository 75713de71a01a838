#include "api/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <sstream>

namespace meshnet::api {

namespace {

const prometheus::Histogram::BucketBoundaries kTtftBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                              0.5,   1,    2.5,   5,    10};
const prometheus::Histogram::BucketBoundaries kItlBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};

}  // namespace

ApiMetrics::ApiMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  requests_ = &prometheus::BuildCounter()
                   .Name("meshnet_api_requests_total")
                   .Help("HTTP requests by endpoint and status code")
                   .Register(*registry_);
  prompt_tokens_ = &prometheus::BuildCounter()
                        .Name("meshnet_api_prompt_tokens_total")
                        .Help("Prompt tokens of completed generations")
                        .Register(*registry_)
                        .Add({});
  completion_tokens_ = &prometheus::BuildCounter()
                            .Name("meshnet_api_completion_tokens_total")
                            .Help("Generated tokens")
                            .Register(*registry_)
                            .Add({});
  cached_tokens_ = &prometheus::BuildCounter()
                        .Name("meshnet_api_prompt_tokens_cached_total")
                        .Help("Prompt tokens whose KV a kept session already held (prefix cache)")
                        .Register(*registry_)
                        .Add({});
  auto counter = [this](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add({});
  };
  route_passes_ = counter("meshnet_api_route_passes_total",
                          "Passes of steps through the route (prefills, decode and verify steps)");
  route_seconds_ = counter("meshnet_api_route_seconds_total", "Wall time of the route passes");
  route_compute_seconds_ =
      counter("meshnet_api_route_compute_seconds_total",
              "The hops' own compute in route passes that said it (chain forwarding): the rest of "
              "their time is links");
  drafted_ = counter("meshnet_api_draft_tokens_total", "Draft tokens sent to be verified");
  accepted_ = counter("meshnet_api_draft_tokens_accepted_total",
                      "Draft tokens the route's tail sampled too (kept)");
  ttft_ = &prometheus::BuildHistogram()
               .Name("meshnet_api_time_to_first_token_seconds")
               .Help("From request arrival to the first generated token")
               .Register(*registry_)
               .Add({}, kTtftBuckets);
  itl_ = &prometheus::BuildHistogram()
              .Name("meshnet_api_inter_token_latency_seconds")
              .Help("Between consecutive generated tokens of one request")
              .Register(*registry_)
              .Add({}, kItlBuckets);
  in_flight_ = &prometheus::BuildGauge()
                    .Name("meshnet_api_requests_in_flight")
                    .Help("Generations running now")
                    .Register(*registry_)
                    .Add({});
  queued_ = &prometheus::BuildGauge()
                 .Name("meshnet_api_requests_queued")
                 .Help("Generations waiting for a slot")
                 .Register(*registry_)
                 .Add({});
}

ApiMetrics::~ApiMetrics() = default;

void ApiMetrics::CountRequest(const std::string& endpoint, int status) {
  requests_->Add({{"endpoint", endpoint}, {"status", std::to_string(status)}}).Increment();
}

void ApiMetrics::AddTokens(int prompt_tokens, int completion_tokens) {
  prompt_tokens_->Increment(prompt_tokens);
  completion_tokens_->Increment(completion_tokens);
}

void ApiMetrics::AddRouteUse(const RouteUse& use) {
  route_passes_->Increment(static_cast<double>(use.passes));
  route_seconds_->Increment(use.seconds);
  route_compute_seconds_->Increment(use.compute_seconds);
  drafted_->Increment(static_cast<double>(use.drafted));
  accepted_->Increment(static_cast<double>(use.accepted));
}

void ApiMetrics::AddCachedTokens(int64_t tokens) {
  cached_tokens_->Increment(static_cast<double>(tokens));
}

void ApiMetrics::ObserveTimeToFirstToken(double seconds) { ttft_->Observe(seconds); }

void ApiMetrics::ObserveInterTokenLatency(double seconds) { itl_->Observe(seconds); }

std::string ApiMetrics::Render(int in_flight, int queued) {
  in_flight_->Set(in_flight);
  queued_->Set(queued);
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  if (extra_) out << extra_();
  return out.str();
}

}  // namespace meshnet::api

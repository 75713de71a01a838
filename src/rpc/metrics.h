// Prometheus metrics of a node, collected at scrape time from the KV manager's
// HotKvStats and the NodeCore counters (so gauges are exact when scraped).
// Internal to rpc/.
//
// Thread-safety: Collect() may run concurrently with steps.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

namespace meshnet::rpc {

class NodeCore;

class NodeMetrics final : public prometheus::Collectable {
 public:
  explicit NodeMetrics(NodeCore* core) : core_(core) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  NodeCore* core_;
};

}  // namespace meshnet::rpc

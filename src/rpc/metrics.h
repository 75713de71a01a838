// Prometheus metrics of a node, collected at scrape time from the KV manager's
// HotKvStats and the node::NodeCore counters (so gauges are exact when scraped).
// Internal to rpc/.
//
// Thread-safety: Collect() may run concurrently with steps.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

namespace meshnet::node {
class NodeCore;
}

namespace meshnet::rpc {

class NodeMetrics final : public prometheus::Collectable {
 public:
  explicit NodeMetrics(node::NodeCore* core) : core_(core) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  node::NodeCore* core_;
};

}  // namespace meshnet::rpc

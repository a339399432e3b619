// The metric families as a scrape sees them: the served models' events are
// counted under their event and outcome, bound at start-up, and an event
// the metrics do not know is not counted.
#include "server/execution/metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace attnserve {
namespace {

// attnserve_model_events_total's values by "event/outcome".
std::map<std::string, double> ModelEvents(const ServiceMetrics& metrics) {
  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& family : metrics.registry()->Collect()) {
    if (family.name != "attnserve_model_events_total") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::string event, outcome;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "event") event = label.value;
        if (label.name == "outcome") outcome = label.value;
      }
      values[event + "/" + outcome] = metric.counter.value;
    }
  }
  return values;
}

TEST(ServiceMetricsTest, ModelEventsAreCountedByEventAndOutcome) {
  std::unique_ptr<ServiceMetrics> metrics =
      ServiceMetrics::Create({{"reference", "reference"}}).value();
  // Every label set is there from the start, at 0.
  std::map<std::string, double> values = ModelEvents(*metrics);
  ASSERT_EQ(values.size(), 8u);
  for (const auto& [labels, value] : values) EXPECT_EQ(value, 0) << labels;
  metrics->ModelEvent("load", /*refused=*/false);
  metrics->ModelEvent("replace", /*refused=*/true);
  metrics->ModelEvent("replace", /*refused=*/true);
  metrics->ModelEvent("no such event", /*refused=*/false);
  values = ModelEvents(*metrics);
  EXPECT_EQ(values.size(), 8u);
  EXPECT_EQ(values["load/ok"], 1);
  EXPECT_EQ(values["replace/refused"], 2);
  EXPECT_EQ(values["replace/ok"], 0);
  double total = 0;
  for (const auto& [labels, value] : values) total += value;
  EXPECT_EQ(total, 3);
}

}  // namespace
}  // namespace attnserve

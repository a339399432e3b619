// The metric families as a scrape sees them: the served models' events are
// counted under their event and outcome, bound at start-up, and an event
// the metrics do not know is not counted; each stored model's computed
// calls are counted by the backend that ran them; what the GPU holds of
// stored memories is sampled at scrape time, and absent without a GPU; so
// are the rows of stored models that grow, and their appends and
// evictions are counted by model.
#include "server/execution/metrics.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

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
  // load, replace, unload, save, append, evict, compact; ok and refused.
  ASSERT_EQ(values.size(), 14u);
  for (const auto& [labels, value] : values) EXPECT_EQ(value, 0) << labels;
  metrics->ModelEvent("load", /*refused=*/false);
  metrics->ModelEvent("replace", /*refused=*/true);
  metrics->ModelEvent("replace", /*refused=*/true);
  metrics->ModelEvent("append", /*refused=*/false);
  metrics->ModelEvent("evict", /*refused=*/true);
  metrics->ModelEvent("no such event", /*refused=*/false);
  metrics->ModelEvent("compact", /*refused=*/true);
  values = ModelEvents(*metrics);
  EXPECT_EQ(values.size(), 14u);
  EXPECT_EQ(values["compact/refused"], 1);
  EXPECT_EQ(values["load/ok"], 1);
  EXPECT_EQ(values["append/ok"], 1);
  EXPECT_EQ(values["evict/refused"], 1);
  EXPECT_EQ(values["replace/refused"], 2);
  EXPECT_EQ(values["replace/ok"], 0);
  double total = 0;
  for (const auto& [labels, value] : values) total += value;
  EXPECT_EQ(total, 6);
}

// The value of every sample of family `name`, by its labels joined as
// "name=value,..." (empty for none).
std::map<std::string, double> Samples(const std::vector<prometheus::MetricFamily>& families,
                                      const std::string& name) {
  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& family : families) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::string labels;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        labels += (labels.empty() ? "" : ",") + label.name + "=" + label.value;
      }
      values[labels] = family.type == prometheus::MetricType::Counter
                           ? metric.counter.value
                           : metric.gauge.value;
    }
  }
  return values;
}

TEST(ServiceMetricsTest, StoredModelCallsAreCountedByTheBackendThatRanThem) {
  std::unique_ptr<ServiceMetrics> metrics =
      ServiceMetrics::Create({{"cuda-decode", "cuda"},
                              {"cpu-key-shares", "onednn-cpu"}})
          .value();
  metrics->ModelKernelRun("memory_a", "cuda-decode");
  metrics->ModelKernelRun("memory_a", "cuda-decode");
  metrics->ModelKernelRun("memory_a", "cpu-key-shares");
  metrics->ModelKernelRun("memory_b", "something new");
  const std::map<std::string, double> runs = Samples(
      metrics->registry()->Collect(), "attnserve_model_kernel_runs_total");
  EXPECT_EQ(runs, (std::map<std::string, double>{
                      {"backend=cuda,model=memory_a", 2},
                      {"backend=onednn-cpu,model=memory_a", 1},
                      {"backend=other,model=memory_b", 1}}));
}

TEST(ServiceMetricsTest, HeldMemoryFamiliesAreSampledOnlyWithADevice) {
  std::unique_ptr<ServiceMetrics> metrics =
      ServiceMetrics::Create({{"reference", "reference"}}).value();
  std::optional<attn::HeldMemoryStats> stats;
  metrics->SetHeldMemorySource([&stats] { return stats; });
  const std::string held = "attnserve_device_memory_held_bytes";
  EXPECT_TRUE(Samples(metrics->sampled()->Collect(), held).empty());
  stats = attn::HeldMemoryStats{};
  stats->budget_bytes = 1000;
  stats->bytes_held = 640;
  stats->memories_held = 2;
  stats->placements = 3;
  stats->evictions = 1;
  stats->refusals = 4;
  const std::vector<prometheus::MetricFamily> families =
      metrics->sampled()->Collect();
  auto value = [&](const std::string& name) {
    const std::map<std::string, double> samples = Samples(families, name);
    EXPECT_EQ(samples.size(), 1u) << name;
    return samples.empty() ? -1.0 : samples.begin()->second;
  };
  EXPECT_EQ(value(held), 640);
  EXPECT_EQ(value("attnserve_device_memory_budget_bytes"), 1000);
  EXPECT_EQ(value("attnserve_device_memories_held"), 2);
  EXPECT_EQ(value("attnserve_device_memory_placements_total"), 3);
  EXPECT_EQ(value("attnserve_device_memory_evictions_total"), 1);
  EXPECT_EQ(value("attnserve_device_memory_refusals_total"), 4);
}

// Issue #47: rows, files, evicted rows and pieces per stored model at
// scrape time;
// appends (with their latency) and evictions counted by model.
TEST(ServiceMetricsTest, StoredModelsRowsAppendsAndEvictions) {
  std::unique_ptr<ServiceMetrics> metrics =
      ServiceMetrics::Create({{"reference", "reference"}}).value();
  metrics->SetStoredRowsSource([] {
    return std::vector<ServiceMetrics::StoredRows>{{"memory", 1024, 3, 16, 2},
                                                   {"net", 50, 1, 0, 1}};
  });
  metrics->RowsChanged("memory", /*evict=*/false, absl::Milliseconds(4));
  metrics->RowsChanged("memory", /*evict=*/false, absl::Milliseconds(30));
  metrics->RowsChanged("memory", /*evict=*/true, absl::Milliseconds(3));
  metrics->Compacted("memory");
  std::map<std::string, double> values;
  for (const auto& collectable : {std::shared_ptr<prometheus::Collectable>(
                                      metrics->registry()),
                                  metrics->sampled()}) {
    for (const prometheus::MetricFamily& family : collectable->Collect()) {
      for (const prometheus::ClientMetric& metric : family.metric) {
        std::string model;
        for (const auto& label : metric.label) {
          if (label.name == "model") model = label.value;
        }
        if (model.empty()) continue;
        const std::string key = family.name + "/" + model;
        if (family.type == prometheus::MetricType::Gauge) {
          values[key] = metric.gauge.value;
        } else if (family.type == prometheus::MetricType::Counter) {
          values[key] = metric.counter.value;
        } else if (family.type == prometheus::MetricType::Histogram) {
          values[key] = static_cast<double>(metric.histogram.sample_count);
          values[key + "/sum"] = metric.histogram.sample_sum;
        }
      }
    }
  }
  EXPECT_EQ(values["attnserve_model_rows/memory"], 1024);
  EXPECT_EQ(values["attnserve_model_files/memory"], 3);
  EXPECT_EQ(values["attnserve_model_evicted_rows/memory"], 16);
  EXPECT_EQ(values["attnserve_model_pieces/memory"], 2);
  EXPECT_EQ(values["attnserve_model_rows/net"], 50);
  EXPECT_EQ(values["attnserve_model_pieces/net"], 1);
  EXPECT_EQ(values["attnserve_model_appends_total/memory"], 2);
  EXPECT_EQ(values["attnserve_model_evictions_total/memory"], 1);
  EXPECT_EQ(values["attnserve_model_compactions_total/memory"], 1);
  EXPECT_EQ(values["attnserve_model_append_seconds/memory"], 2);
  EXPECT_NEAR(values["attnserve_model_append_seconds/memory/sum"], 0.034, 1e-9);
}

}  // namespace
}  // namespace attnserve

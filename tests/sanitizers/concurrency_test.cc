// Shared state of the server touched from many threads at once, for the
// sanitizer passes (tests/sanitizers/run_sanitizers.sh; under ThreadSanitizer
// this is the race check of each):
//  - the oneDNN backend's primitive cache (lib/attn/onednn_backend.cc):
//    hits, misses and evictions from several threads, every result checked;
//  - the model repository (server/repository/model_repository.h): Find and Names while
//    SaveFittedModel replaces models; uploads, reloads and unloads of one
//    model while it is read; appends while it is read, reloaded and
//    unloaded;
//  - the service metrics (server/execution/metrics.h): the hot path from several
//    threads while a scrape collects.
// The batcher and the worker pool have theirs beside them
// (server/execution/batcher_test.cc, server/execution/worker_pool_test.cc).
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "attn/engine.h"
#include "attn/onednn_backend.h"
#include "attn/testing/engines.h"
#include "attn/testing/error_bounds.h"
#include "attn/testing/random.h"
#include "gtest/gtest.h"
#include "server/execution/metrics.h"
#include "server/models/model_catalogue.h"
#include "server/repository/model_repository.h"
#include "server/repository/safetensors.h"

namespace attnserve {
namespace {

using ::attn::testing::RandomNormal;
using ::attn::testing::WithinBounds;

// One input and its exact answer, made on the test's thread.
struct MatmulCase {
  attn::Tensor a, b;
  attn::OpResult exact;
  attn::testing::ErrorBounds bounds;
};
struct SoftmaxCase {
  attn::Tensor x;
  attn::OpResult exact;
  attn::testing::ErrorBounds bounds;
};

// A cache of 3 shapes against 7 shapes in use: threads keep missing, creating
// and evicting primitives while others execute theirs (a primitive handle is
// reference-counted, so an evicted one stays valid while it runs).
TEST(EngineConcurrencyTest, PrimitiveCacheUnderContention) {
  attn::OneDnnBackend::Options backend_options;
  backend_options.primitive_cache_capacity = 3;
  backend_options.max_threads = 1;
  std::vector<std::unique_ptr<attn::Backend>> backends;
  backends.push_back(attn::OneDnnBackend::Create(backend_options).value());
  std::unique_ptr<attn::Engine> engine =
      attn::Engine::CreateWithBackends(std::move(backends)).value();
  ASSERT_EQ(engine->backend_names().front(), "onednn-cpu");

  std::mt19937 rng(12);
  std::vector<MatmulCase> matmuls;
  std::vector<SoftmaxCase> softmaxes;
  for (int i = 0; i < 4; ++i) {
    MatmulCase c;
    c.a = RandomNormal(rng, {1 + i % 2, 3 + i, 5});
    c.b = RandomNormal(rng, {1 + i % 2, 5, 2 + i});
    const attn::BatchMatmulRequest request{c.a.view(), c.b.view()};
    c.exact = attn::testing::ReferenceEngine().BatchMatmul(request).value();
    c.bounds = attn::testing::BatchMatmulBounds(request, c.exact);
    matmuls.push_back(std::move(c));
  }
  for (int i = 0; i < 3; ++i) {
    SoftmaxCase c;
    c.x = RandomNormal(rng, {2, 3, 4 + 3 * i});
    const attn::MaskedSoftmaxRequest request{c.x.view(), {}};
    c.exact = attn::testing::ReferenceEngine().MaskedSoftmax(request).value();
    c.bounds = attn::testing::MaskedSoftmaxBounds(request, c.exact);
    softmaxes.push_back(std::move(c));
  }

  constexpr int kThreads = 4, kRounds = 12;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const MatmulCase& m = matmuls[(t + round) % matmuls.size()];
        absl::StatusOr<attn::OpResult> product =
            engine->BatchMatmul({m.a.view(), m.b.view()});
        ASSERT_TRUE(product.ok()) << product.status();
        EXPECT_EQ(product->implementation, "onednn-matmul");
        EXPECT_EQ(product->backend, "onednn-cpu");
        EXPECT_TRUE(WithinBounds(product->output, m.exact.output,
                                 m.bounds.output));
        const SoftmaxCase& s = softmaxes[(t * 2 + round) % softmaxes.size()];
        absl::StatusOr<attn::OpResult> softmax =
            engine->MaskedSoftmax({s.x.view(), {}});
        ASSERT_TRUE(softmax.ok()) << softmax.status();
        EXPECT_TRUE(WithinBounds(softmax->output, s.exact.output,
                                 s.bounds.output));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

std::string TempDir() {
  char pattern[] = "/tmp/attnserve-concurrency-XXXXXX";
  const char* dir = mkdtemp(pattern);
  return dir == nullptr ? std::string() : std::string(dir);
}

// Readers see either no model or a whole one, never half of a replaced one.
TEST(ModelRepositoryConcurrencyTest, LookupsWhileSaving) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<ModelRepository> repository =
      LoadModelRepository(dir).value();
  ModelCatalogue catalogue(repository.get());
  constexpr int kModels = 3, kSaves = 8;
  std::atomic<bool> saving{true};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      while (saving.load()) {
        for (int m = 0; m < kModels; ++m) {
          const std::string name = "fitted-" + std::to_string(m);
          std::shared_ptr<const RepositoryModel> model =
              repository->Find(name);
          if (model == nullptr) continue;
          EXPECT_EQ(model->config.name(), name);
          const StoredTensor& bandwidth = model->tensors.at("bandwidth");
          ASSERT_EQ(bandwidth.num_elements(), 1);
          EXPECT_GE(bandwidth.data[0], 1.0f);
        }
        EXPECT_LE(repository->Names().size(), static_cast<size_t>(kModels));
        if (r == 1) std::this_thread::yield();
      }
    });
  }
  for (int save = 0; save < kSaves; ++save) {
    for (int m = 0; m < kModels; ++m) {
      static const float kX[] = {0.5f, 1.5f}, kY[] = {1.0f, 2.0f};
      ASSERT_TRUE(catalogue
                      .SaveFittedModel("fitted-" + std::to_string(m),
                                       1.0f + save + m,
                                       attn::TensorView{kX, {2}},
                                       attn::TensorView{kY, {2}})
                      .ok());
    }
  }
  saving.store(false);
  for (std::thread& reader : readers) reader.join();
  EXPECT_EQ(repository->Find("fitted-2")->tensors.at("bandwidth").data[0],
            1.0f + (kSaves - 1) + 2);
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
}

// Uploads, reloads and unloads of one model at once, read all the while:
// every version read is one whole upload (its keys and values all hold the
// same number), the index names the model in one of Triton's states, and
// what is served at the end is what is on disk.
TEST(ModelRepositoryConcurrencyTest, UploadsReloadsAndUnloadsOfOneModel) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<ModelRepository> repository =
      LoadModelRepository(dir).value();
  ModelCatalogue catalogue(repository.get(),
                           ModelControl{/*explicit_mode=*/true, /*needs_permission=*/false,
                                        /*on_event=*/{}});
  auto upload = [](float version) {
    std::map<std::string, attn::Tensor> tensors;
    tensors["keys"] = attn::Tensor::Zeros({64, 8});
    tensors["values"] = attn::Tensor::Zeros({64, 4});
    for (auto& [name, tensor] : tensors) {
      std::fill(tensor.data.begin(), tensor.data.end(), version);
    }
    return ModelUpload{R"({"backend": "attention_memory"})",
                       {{"file:weights.safetensors", SerializeSafetensors(tensors)}}};
  };
  const std::vector<std::string> names = {"config", "file:weights.safetensors"};
  const absl::Status first = catalogue.Load(true, "mem", names, upload(1.0f));
  ASSERT_TRUE(first.ok()) << first;
  std::atomic<bool> running{true};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&] {
      while (running.load()) {
        absl::StatusOr<ServedModel> model = catalogue.Resolve("mem", "");
        if (model.ok()) {
          const float version = model->stored->tensors.at("keys").data[0];
          for (const auto& [name, tensor] : model->stored->tensors) {
            for (float value : tensor.values()) {
              ASSERT_EQ(value, version) << name;
            }
          }
        } else {
          EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
        }
        for (const auto& state : catalogue.Index(true, false)) {
          if (state.name != "mem") continue;
          EXPECT_TRUE(state.state == "READY" || state.state == "UNLOADING" ||
                      state.state == "UNAVAILABLE")
              << state.state;
        }
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < 10; ++i) {
      catalogue.Unload(true, "mem", {}).IgnoreError();  // may be unloaded
      EXPECT_TRUE(catalogue.Load(true, "mem", {}).ok());
    }
  });
  for (int u = 0; u < 2; ++u) {
    threads.emplace_back([&, u] {
      for (int i = 0; i < 10; ++i) {
        EXPECT_TRUE(catalogue.Load(true, "mem", names,
                                   upload(2.0f + 2 * i + u)).ok());
      }
    });
  }
  for (size_t t = 2; t < threads.size(); ++t) threads[t].join();
  running.store(false);
  threads[0].join();
  threads[1].join();
  ASSERT_TRUE(catalogue.Load(true, "mem", {}).ok());
  const float served =
      catalogue.Resolve("mem", "")->stored->tensors.at("keys").data[0];
  std::unique_ptr<ModelRepository> reread = LoadModelRepository(dir).value();
  EXPECT_EQ(reread->Find("mem")->tensors.at("keys").data[0], served);
  // Once quiet, the index tells what is served: READY while it resolves,
  // UNAVAILABLE once unloaded and it does not.
  auto indexed = [&catalogue] {
    for (const auto& state : catalogue.Index(true, false)) {
      if (state.name == "mem") return state.state;
    }
    return std::string("not listed");
  };
  EXPECT_EQ(indexed(), "READY");
  ASSERT_TRUE(catalogue.Unload(true, "mem", {}).ok());
  EXPECT_EQ(catalogue.Resolve("mem", "").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(indexed(), "UNAVAILABLE");
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
}

// Appends rows [first, first + n) to memory "mem" (making it when
// `create`): row i holds keys [i, i] and value -i.
absl::StatusOr<ModelRepository::Appended> AppendIndexedRows(
    ModelCatalogue& catalogue, int64_t first, int64_t n, bool create) {
  std::vector<float> keys, values;
  for (int64_t i = first; i < first + n; ++i) {
    keys.insert(keys.end(), 2, static_cast<float>(i));
    values.push_back(-static_cast<float>(i));
  }
  return catalogue.Append(
      /*may_append=*/true, "mem", attn::TensorView{keys.data(), {n, 2}},
      attn::TensorView{values.data(), {n, 1}},
      create ? std::optional<MemorySettings>(MemorySettings{}) : std::nullopt);
}

// Appends to one memory while it is read, reloaded from disk and unloaded
// (issue #47): the grown buffers are written past the end of every version
// a reader holds, so every version read is a whole prefix of the rows (row
// i holds keys i and value -i), and the appends answered OK are all there
// at the end, in order, in memory and on disk.
TEST(ModelRepositoryConcurrencyTest, AppendsWhileReadReloadedAndUnloaded) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<ModelRepository> repository =
      LoadModelRepository(dir).value();
  ModelCatalogue catalogue(repository.get());
  auto append = [&](int64_t first, int64_t n, bool create) {
    return AppendIndexedRows(catalogue, first, n, create);
  };
  // The rows of `model`, or -1 if one does not hold its index.
  auto checked_rows = [](const RepositoryModel& model) -> int64_t {
    const StoredTensor& keys = model.tensors.at("keys");
    const StoredTensor& values = model.tensors.at("values");
    if (values.shape[0] != keys.shape[0]) return -1;
    // Part by part: a grown memory is held in pieces.
    auto holds = [](const StoredTensor& tensor, int64_t width, float sign) {
      int64_t i = 0;
      for (const StoredTensor& part : tensor.parts()) {
        for (int64_t row = 0; row < part.shape[0]; ++row, ++i) {
          for (int64_t j = 0; j < width; ++j) {
            if (part.data[row * width + j] != sign * i) return false;
          }
        }
      }
      return i == tensor.shape[0];
    };
    if (!holds(keys, 2, 1.0f) || !holds(values, 1, -1.0f)) return -1;
    return keys.shape[0];
  };
  ASSERT_TRUE(append(0, 1, /*create=*/true).ok());
  std::atomic<bool> done{false};
  std::atomic<int64_t> bad_versions{0}, versions_read{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&] {
      while (!done.load()) {
        std::shared_ptr<const RepositoryModel> model = repository->Find("mem");
        if (model == nullptr) continue;
        if (checked_rows(*model) < 1) ++bad_versions;
        ++versions_read;
      }
    });
  }
  std::thread control([&] {
    for (int i = 0; i < 20; ++i) {
      EXPECT_TRUE(repository->LoadModel("mem").ok());
      if (i % 5 == 4) {
        repository->UnloadModel("mem").IgnoreError();
        EXPECT_TRUE(repository->LoadModel("mem").ok());
      }
    }
  });
  int64_t rows = 1;
  for (int i = 0; i < 60; ++i) {
    absl::StatusOr<ModelRepository::Appended> appended =
        append(rows, 1 + i % 3, /*create=*/false);
    if (!appended.ok()) {
      // Only between the control thread's unload and its load.
      EXPECT_EQ(appended.status().code(), absl::StatusCode::kFailedPrecondition)
          << appended.status();
      continue;
    }
    EXPECT_EQ(appended->first_row, rows);
    rows = appended->rows;
  }
  control.join();
  done.store(true);
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(bad_versions.load(), 0);
  EXPECT_GT(versions_read.load(), 0);
  EXPECT_EQ(checked_rows(*repository->Find("mem")), rows);
  std::unique_ptr<ModelRepository> reread = LoadModelRepository(dir).value();
  EXPECT_EQ(checked_rows(*reread->Find("mem")), rows);
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
}

// Compactions (issue #47), in the background and called, while one memory
// grows, loses its oldest rows, is read and reloaded: every version read is
// a run of consecutive rows (row i holds keys i and value -i, from the
// first not evicted), compactions that lose the race give way (ABORTED),
// and what is served at the end is what a restart reads.
TEST(ModelRepositoryConcurrencyTest, CompactionsWhileGrownEvictedAndReloaded) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  ModelRepository::Options options;
  options.dir = dir;
  options.log = [](const std::string&) {};
  options.compaction.in_background = true;
  options.compaction.min_rows_files = 2;
  std::atomic<int> background_failures{0};
  // Compactions done, in the background or called.
  std::atomic<int64_t> compactions{0};
  options.compaction.on_done = [&](const std::string&,
                                   const absl::Status& status, absl::Duration) {
    if (status.ok()) ++compactions;
    if (!status.ok() && !absl::IsAborted(status)) ++background_failures;
  };
  std::unique_ptr<ModelRepository> repository =
      LoadModelRepository(options).value();
  ModelCatalogue catalogue(repository.get());
  auto append = [&](int64_t first, int64_t n, bool create) {
    return AppendIndexedRows(catalogue, first, n, create);
  };
  // Whether `model` holds consecutive rows; its first in *first.
  auto consecutive = [](const RepositoryModel& model, int64_t* first) {
    const StoredTensor& keys = model.tensors.at("keys");
    const StoredTensor& values = model.tensors.at("values");
    if (values.shape[0] != keys.shape[0] || keys.shape[0] < 1) return false;
    *first = static_cast<int64_t>(keys.parts().front().data[0]);
    // Part by part: a grown memory is held in pieces.
    auto holds = [first](const StoredTensor& tensor, int64_t width,
                         float sign) {
      int64_t i = 0;
      for (const StoredTensor& part : tensor.parts()) {
        for (int64_t row = 0; row < part.shape[0]; ++row, ++i) {
          for (int64_t j = 0; j < width; ++j) {
            if (part.data[row * width + j] !=
                sign * static_cast<float>(*first + i)) {
              return false;
            }
          }
        }
      }
      return i == tensor.shape[0];
    };
    return holds(keys, 2, 1.0f) && holds(values, 1, -1.0f);
  };
  ASSERT_TRUE(append(0, 4, /*create=*/true).ok());
  std::atomic<bool> done{false};
  std::atomic<int64_t> bad_versions{0}, versions_read{0};
  std::thread reader([&] {
    while (!done.load()) {
      std::shared_ptr<const RepositoryModel> model = repository->Find("mem");
      int64_t first = 0;
      if (model != nullptr && !consecutive(*model, &first)) ++bad_versions;
      ++versions_read;
    }
  });
  std::thread changer([&] {  // compactions called, evictions, a reload
    for (int i = 0; !done.load(); ++i) {
      absl::StatusOr<ModelRepository::Compacted> compacted =
          repository->CompactRows("mem");
      if (compacted.ok()) {
        compactions += compacted->compacted;
      } else {
        EXPECT_TRUE(absl::IsAborted(compacted.status())) << compacted.status();
      }
      if (i % 3 == 0) catalogue.Evict(true, "mem", 1).IgnoreError();
      if (i % 7 == 0) {
        EXPECT_TRUE(repository->LoadModel("mem").ok());
      }
    }
  });
  // Most compactions give way to the evictions and reloads racing them:
  // the appends go on until some have been done (a bound keeps a broken
  // compaction from looping for ever).
  int64_t next = 4;
  for (int i = 0; i < 80 || (compactions.load() == 0 && i < 20000); ++i) {
    absl::StatusOr<ModelRepository::Appended> appended =
        append(next, 1 + i % 3, /*create=*/false);
    ASSERT_TRUE(appended.ok()) << appended.status();
    next += 1 + i % 3;
  }
  done.store(true);
  reader.join();
  changer.join();
  EXPECT_EQ(bad_versions.load(), 0);
  EXPECT_GT(versions_read.load(), 0);
  EXPECT_GT(compactions.load(), 0);
  EXPECT_EQ(background_failures.load(), 0);
  int64_t first = 0, reread_first = 0;
  std::shared_ptr<const RepositoryModel> served = repository->Find("mem");
  ASSERT_TRUE(consecutive(*served, &first));
  EXPECT_EQ(first + served->tensors.at("keys").shape[0], next);
  repository.reset();  // stops the background compactions
  std::unique_ptr<ModelRepository> reread = LoadModelRepository(dir).value();
  ASSERT_TRUE(consecutive(*reread->Find("mem"), &reread_first));
  EXPECT_EQ(reread_first, first);
  EXPECT_EQ(reread->Find("mem")->tensors.at("keys").shape[0], next - first);
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
}

// The hot path (counters and histograms bound at start-up) from several
// threads while the registry and the sampled collector are scraped.
TEST(MetricsConcurrencyTest, HotPathWhileScraping) {
  std::unique_ptr<ServiceMetrics> metrics =
      ServiceMetrics::Create({{"cpu-fused-blocks", "onednn-cpu"},
                              {"reference", "reference"}})
          .value();
  std::atomic<int> depth{0};
  // Before anything is served, as its contract asks.
  metrics->SetQueueDepthSource([&depth] { return depth.load(); });
  constexpr int kThreads = 3, kCalls = 200;
  absl::Notification done;
  std::thread scraper([&] {
    while (!done.HasBeenNotified()) {
      EXPECT_FALSE(metrics->registry()->Collect().empty());
      EXPECT_FALSE(metrics->sampled()->Collect().empty());
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        const Operation operation = static_cast<Operation>((t + i) % kOperationCount);
        depth.fetch_add(1);
        metrics->RequestStarted();
        metrics->QueueWait(operation, absl::Microseconds(i));
        metrics->KernelRun(operation,
                           i % 3 == 0 ? "reference" : "cpu-fused-blocks",
                           absl::Microseconds(2 * i));
        metrics->KernelRun(operation, "unknown-backend", absl::Microseconds(1));
        metrics->BatchExecuted(operation, 1 + i % 4, 100, 80);
        metrics->RequestFinished(operation, Protocol::kGrpc, absl::StatusCode::kOk,
                                 absl::Microseconds(3 * i));
        metrics->Unauthenticated(i % 2 == 0);
        depth.fetch_sub(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done.Notify();
  scraper.join();
}

}  // namespace
}  // namespace attnserve

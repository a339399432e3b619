// Appends to stored models (issue #47, slice 1): rows added to a memory or
// a training set are served at once and after a restart, every version a
// call holds keeps exactly its rows, bad appends change nothing (their races
// with reads, reloads and unloads are in tests/sanitizers/
// concurrency_test.cc, for ThreadSanitizer), and under
// injected faults and crashes at every step an append answered OK is never
// lost and a partial one never appears.
#include <dirent.h>

#include <cerrno>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "attn/bfloat16.h"
#include "server/models/model_catalogue.h"
#include "server/models/model_kinds.h"
#include "server/repository/fault_injection_file_system.h"
#include "server/repository/model_repository.h"
#include "server/repository/test_folders.h"
#include "server/models/test_rows.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Op = FaultInjectionFileSystem::Op;

TEST(AppendRowsTest, FirstAppendMakesTheMemoryAndLaterOnesGrowIt) {
  const std::string dir = TempDir("attnserve-append");
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get());
  absl::StatusOr<ModelRepository::Appended> made = Append(catalogue, 0, 3);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->first_row, 0);
  EXPECT_EQ(made->rows, 3);
  EXPECT_EQ(made->files, 1);
  std::shared_ptr<const RepositoryModel> first = repository->Find("m");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->config.backend(), "attention_memory");

  // Many small appends: the buffers grow several times underneath.
  int64_t rows = 3;
  for (int64_t n : {1, 2, 5, 16, 1, 40, 100, 7}) {
    absl::StatusOr<ModelRepository::Appended> appended =
        Append(catalogue, rows, n, /*create=*/false);
    ASSERT_TRUE(appended.ok()) << appended.status();
    EXPECT_EQ(appended->first_row, rows);
    rows += n;
    EXPECT_EQ(appended->rows, rows);
    EXPECT_EQ(CheckedRows(*repository->Find("m")), rows);
  }
  // The version a call held before keeps exactly its rows.
  EXPECT_EQ(CheckedRows(*first), 3);
  EXPECT_EQ(Entries(dir + "/m").size(), 2u + 8u);  // config, weights, 8 rows files
  EXPECT_EQ(RowsAfterRestart(dir), rows);

  // Reloaded from disk, it keeps growing, numbered after the rows read.
  auto reloaded = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue again(reloaded.get());
  absl::StatusOr<ModelRepository::Appended> appended =
      Append(again, rows, 2, /*create=*/false);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->first_row, rows);
  EXPECT_EQ(appended->files, 10);
  EXPECT_EQ(RowsAfterRestart(dir), rows + 2);
}

// The buffers appends grow in are freed with the last version that uses
// them: an unload, a reload and a whole save each let them go.
TEST(AppendRowsTest, GrownRowsAreFreedWithTheirLastVersion) {
  const std::string dir = TempDir("attnserve-append");
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get());
  ASSERT_TRUE(Append(catalogue, 0, 3).ok());
  for (const char* how : {"unload", "reload", "save"}) {
    SCOPED_TRACE(how);
    const int64_t rows = CheckedRows(*repository->Find("m"));
    ASSERT_TRUE(Append(catalogue, rows, 2, /*create=*/false).ok());
    // (The rows appended: the last piece of a memory in pieces.)
    std::weak_ptr<const void> keys =
        repository->Find("m")->tensors.at("keys").parts().back().storage;
    ASSERT_FALSE(keys.expired());
    if (std::string(how) == "unload") {
      ASSERT_TRUE(repository->UnloadModel("m").ok());
      EXPECT_TRUE(keys.expired());
      ASSERT_TRUE(repository->LoadModel("m").ok());
    } else if (std::string(how) == "reload") {
      ASSERT_TRUE(repository->LoadModel("m").ok());
      // The reloaded version has grown buffers of its own.
      EXPECT_TRUE(keys.expired());
    } else {
      const Rows whole = MakeRows(0, rows + 2);
      ASSERT_TRUE(repository
                      ->SaveModel({"load", "memory"}, "m",
                                  NewAttentionMemory("m", {}, whole.key_view(),
                                                     whole.value_view())
                                      .value())
                      .ok());
      EXPECT_TRUE(keys.expired());
    }
    EXPECT_EQ(CheckedRows(*repository->Find("m")), rows + 2);
  }
}

// The rows appended are file pages, not the server's own memory (the size
// goal: a memory of many GiB in scratch files, mapped), after an append and
// after a restart that reads them from the rows files; with mapping off
// they are the server's memory. A full disk for them fails the append
// before anything durable: RESOURCE_EXHAUSTED, the model served and its
// files as they were, and the next append goes on.
TEST(AppendRowsTest, GrownRowsAreFilePagesAndAFullDiskChangesNothing) {
  for (const bool map : {true, false}) {
    SCOPED_TRACE(map ? "mapped" : "--map_model_weights=false");
    const std::string dir = TempDir("attnserve-append");
    FaultInjectionFileSystem fs(DefaultFileSystem());
    ModelRepository::Options options = OptionsFor(dir, &fs);
    options.map_weights = map;
    auto repository = LoadModelRepository(options).value();
    ModelCatalogue catalogue(repository.get());
    ASSERT_TRUE(Append(catalogue, 0, 3).ok());
    ASSERT_TRUE(Append(catalogue, 3, 2, /*create=*/false).ok());
    auto grown = repository->Find("m");
    EXPECT_EQ(CheckedRows(*grown), 5);
    for (const char* tensor : {"keys", "values"}) {
      for (const StoredTensor& part : grown->tensors.at(tensor).parts()) {
        EXPECT_EQ(InFilePages(part.data), map)
            << tensor << ": " << MappingOf(part.data);
      }
    }
    const std::set<std::string> files = Entries(dir + "/m");
    if (map) {
      fs.SetFault([](const FaultInjectionFileSystem::Step& step) {
        return step.op == Op::kWriteAt ? ENOSPC : 0;
      });
      absl::StatusOr<ModelRepository::Appended> full =
          Append(catalogue, 5, 2, /*create=*/false);
      fs.SetFault(nullptr);
      ASSERT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted)
          << full.status();
      EXPECT_THAT(std::string(full.status().message()),
                  HasSubstr("keeping its rows on disk"));
      EXPECT_THAT(std::string(full.status().message()),
                  HasSubstr("the model is unchanged"));
      EXPECT_EQ(repository->Find("m"), grown);
      EXPECT_EQ(Entries(dir + "/m"), files);
    }
    ASSERT_TRUE(Append(catalogue, 5, 2, /*create=*/false).ok());
    EXPECT_EQ(CheckedRows(*repository->Find("m")), 7);
    EXPECT_EQ(CheckedRows(*grown), 5);  // a version held keeps its rows

    options.file_system = nullptr;
    auto restarted = LoadModelRepository(options).value();
    auto loaded = restarted->Find("m");
    ASSERT_NE(loaded, nullptr);
    EXPECT_EQ(CheckedRows(*loaded), 7);
    for (const StoredTensor& part : loaded->tensors.at("keys").parts()) {
      EXPECT_EQ(InFilePages(part.data), map) << MappingOf(part.data);
    }
    // The scratch files have no names: the folder holds what it did.
    EXPECT_EQ(Entries(dir + "/m").size(), files.size() + 1);
  }
}

// A memory grows in pieces: its base file's rows serve where they are
// mapped, and only the rows appended since are copied, on the first append
// and at a restart alike; an eviction that empties the base leaves one
// piece. A training set, whose kind reads no pieces, grows as one.
TEST(AppendRowsTest, AGrownMemoryServesItsBaseWhereItLies) {
  const std::string dir = TempDir("attnserve-append");
  {
    auto repository = LoadModelRepository(OptionsFor(dir)).value();
    ModelCatalogue catalogue(repository.get());
    ASSERT_TRUE(Append(catalogue, 0, 3).ok());
    const StoredTensor base = repository->Find("m")->tensors.at("keys");
    ASSERT_FALSE(base.in_pieces());
    ASSERT_TRUE(InFilePages(base.data)) << MappingOf(base.data);
    for (const auto& [at, n] : {std::pair<int64_t, int64_t>{3, 2}, {5, 1},
                                {6, 1}}) {
      SCOPED_TRACE(at);
      ASSERT_TRUE(Append(catalogue, at, n, false).ok());
      const StoredTensor keys = repository->Find("m")->tensors.at("keys");
      ASSERT_EQ(keys.pieces.size(), 2u);
      EXPECT_EQ(keys.pieces[0].data, base.data);  // not copied
      EXPECT_EQ(keys.pieces[0].shape, base.shape);
      EXPECT_EQ(keys.pieces[1].shape[0], at + n - 3);
      EXPECT_EQ(CheckedRows(*repository->Find("m")), at + n);
    }
  }
  auto restarted = LoadModelRepository(OptionsFor(dir)).value();
  const StoredTensor keys = restarted->Find("m")->tensors.at("keys");
  ASSERT_EQ(keys.pieces.size(), 2u);
  EXPECT_EQ(keys.pieces[0].shape[0], 3);
  EXPECT_EQ(keys.pieces[1].shape[0], 4);
  EXPECT_EQ(CheckedRows(*restarted->Find("m")), 7);
  for (const StoredTensor& part : keys.parts()) {
    EXPECT_TRUE(InFilePages(part.data)) << MappingOf(part.data);
  }
  // It grows on in the same two pieces, the base where it was.
  ModelCatalogue catalogue(restarted.get());
  ASSERT_TRUE(Append(catalogue, 7, 2, false).ok());
  const StoredTensor grown = restarted->Find("m")->tensors.at("keys");
  ASSERT_EQ(grown.pieces.size(), 2u);
  EXPECT_EQ(grown.pieces[0].data, keys.pieces[0].data);
  EXPECT_EQ(CheckedRows(*restarted->Find("m")), 9);
  // Evicted past the base: what is left is one piece.
  ASSERT_TRUE(catalogue.Evict(true, "m", 4).ok());
  EXPECT_FALSE(restarted->Find("m")->tensors.at("keys").in_pieces());
  EXPECT_EQ(CheckedRows(*restarted->Find("m"), 4), 5);
  EXPECT_EQ(RowsAfterRestart(dir, 4), 5);

  const float x[] = {0.5f, 1.5f}, y[] = {1.0f, 2.0f};
  ASSERT_TRUE(catalogue
                  .SaveFittedModel("nw", 2.0f, attn::TensorView{x, {2}},
                                   attn::TensorView{y, {2}})
                  .ok());
  const float more_x[] = {2.5f, 3.5f, 4.5f}, more_y[] = {3.0f, 4.0f, 5.0f};
  ASSERT_TRUE(catalogue
                  .Append(true, "nw", attn::TensorView{more_x, {3}},
                          attn::TensorView{more_y, {3}}, std::nullopt)
                  .ok());
  auto again = LoadModelRepository(OptionsFor(dir)).value();
  for (auto* repo : {restarted.get(), again.get()}) {
    for (const char* tensor : {"x_train", "y_train"}) {
      EXPECT_FALSE(repo->Find("nw")->tensors.at(tensor).in_pieces()) << tensor;
      EXPECT_EQ(repo->Find("nw")->tensors.at(tensor).shape[0], 5) << tensor;
    }
  }
}

// Appends are not one message: a memory grows past the largest file a save
// or an upload may write (max_model_bytes) up to max_grown_model_bytes, and
// a restart reads it back; a folder holding more fails to load, naming it.
TEST(AppendRowsTest, AMemoryGrowsPastTheLargestUpload) {
  const std::string dir = TempDir("attnserve-append");
  ModelRepository::Options options = OptionsFor(dir);
  options.max_model_bytes = 1024;
  options.max_grown_model_bytes = 16384;
  auto repository = LoadModelRepository(options).value();
  ModelCatalogue catalogue(repository.get());
  ASSERT_TRUE(Append(catalogue, 0, 10).ok());  // 240 bytes of rows
  int64_t rows = 10;
  absl::StatusOr<ModelRepository::Appended> appended;
  while ((appended = Append(catalogue, rows, 64, /*create=*/false)).ok()) {
    rows = appended->rows;
  }
  EXPECT_EQ(appended.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_GT(repository->Find("m")->stored_bytes, 4 * options.max_model_bytes);
  EXPECT_EQ(CheckedRows(*repository->Find("m")), rows);
  absl::StatusOr<std::unique_ptr<ModelRepository>> reloaded =
      LoadModelRepository(options);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(CheckedRows(*(*reloaded)->Find("m")), rows);
  options.max_grown_model_bytes = 4096;
  reloaded = LoadModelRepository(options);
  EXPECT_EQ(reloaded.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(reloaded.status().message()),
              HasSubstr("--max_grown_model_bytes"));
}

TEST(AppendRowsTest, AWholeUploadReplacesTheAppendedRows) {
  const std::string dir = TempDir("attnserve-append");
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get());
  ASSERT_TRUE(Append(catalogue, 0, 3).ok());
  ASSERT_TRUE(Append(catalogue, 3, 3, /*create=*/false).ok());
  // Saved whole (as an upload saves): 2 rows, no rows files left.
  const Rows rows = MakeRows(0, 2);
  RepositoryModel model =
      NewAttentionMemory("m", {}, rows.key_view(), rows.value_view()).value();
  ASSERT_TRUE(repository->SaveModel({"load", "memory"}, "m", model).ok());
  EXPECT_EQ(CheckedRows(*repository->Find("m")), 2);
  EXPECT_EQ(Entries(dir + "/m"),
            (std::set<std::string>{"config.pbtxt", "weights.safetensors"}));
  absl::StatusOr<ModelRepository::Appended> appended =
      Append(catalogue, 2, 1, /*create=*/false);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->first_row, 2);
  EXPECT_EQ(RowsAfterRestart(dir), 3);
}

TEST(AppendRowsTest, BFloat16MemoriesStoreTheRowsRounded) {
  const std::string dir = TempDir("attnserve-append");
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get());
  MemorySettings settings;
  settings.bfloat16 = true;
  settings.score = attn::ScoreKind::kGaussian;
  settings.scale = 0.3f;
  std::vector<float> keys(kD, 1.00390625f), values(kV, 3.0f);  // 1 + 2^-8
  const attn::TensorView key_view{keys.data(), {1, kD}};
  const attn::TensorView value_view{values.data(), {1, kV}};
  ASSERT_TRUE(catalogue.Append(true, "m", key_view, value_view, settings).ok());
  ASSERT_TRUE(catalogue.Append(true, "m", key_view, value_view, settings).ok());
  auto reloaded = LoadModelRepository(OptionsFor(dir)).value();
  for (auto* repo : {repository.get(), reloaded.get()}) {
    std::shared_ptr<const RepositoryModel> model = repo->Find("m");
    ASSERT_NE(model, nullptr);
    const StoredTensor& stored = model->tensors.at("keys");
    ASSERT_TRUE(stored.is_bfloat16());
    EXPECT_EQ(stored.shape, (attn::Shape{2, kD}));
    // Round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7.
    // (Grown, the memory is held in pieces: the appended row is the last.)
    EXPECT_EQ(attn::WidenBFloat16(stored.parts().back().bfloat16[
                  (stored.parts().back().shape[0] - 1) * kD]),
              1.0f);
    EXPECT_EQ(model->config.parameters().at("score").string_value(), "gaussian");
  }
  // Settings that differ from the memory's are refused.
  settings.bfloat16 = false;
  absl::StatusOr<ModelRepository::Appended> refused =
      catalogue.Append(true, "m", key_view, value_view, settings);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("create: memory 'm' exists with score gaussian"));
  // A value beyond bfloat16's range would round to infinity.
  keys[0] = std::numeric_limits<float>::max();
  refused = catalogue.Append(true, "m", key_view, value_view, std::nullopt);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("keys: element 0"));
  EXPECT_EQ(repository->Find("m")->tensors.at("keys").shape[0], 2);
}

TEST(AppendRowsTest, ATrainingSetGrowsByItsXAndY) {
  const std::string dir = TempDir("attnserve-append");
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get());
  const float x[] = {0.5f, 1.5f}, y[] = {1.0f, 2.0f};
  ASSERT_TRUE(catalogue
                  .SaveFittedModel("nw", 2.0f, attn::TensorView{x, {2}},
                                   attn::TensorView{y, {2}})
                  .ok());
  const float more_x[] = {2.5f, 3.5f, 4.5f}, more_y[] = {3.0f, 4.0f, 5.0f};
  absl::StatusOr<ModelRepository::Appended> appended =
      catalogue.Append(true, "nw", attn::TensorView{more_x, {3}},
                       attn::TensorView{more_y, {3}}, std::nullopt);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->first_row, 2);
  EXPECT_EQ(appended->rows, 5);
  auto reloaded = LoadModelRepository(OptionsFor(dir)).value();
  for (auto* repo : {repository.get(), reloaded.get()}) {
    std::shared_ptr<const RepositoryModel> model = repo->Find("nw");
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(KindOfStored(*model), &TrainedNadarayaWatsonKind());
    const auto values = model->tensors.at("y_train").values();
    EXPECT_EQ(std::vector<float>(values.begin(), values.end()),
              (std::vector<float>{1, 2, 3, 4, 5}));
    EXPECT_EQ(model->tensors.at("bandwidth").data[0], 2.0f);
  }
  // x of another rank than the set's is refused, naming the field.
  const float wide[] = {1, 2};
  absl::StatusOr<ModelRepository::Appended> refused =
      catalogue.Append(true, "nw", attn::TensorView{wide, {1, 2}},
                       attn::TensorView{y, {1}}, std::nullopt);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("keys: shape (1, 2) must be (n,): model 'nw' holds "
                        "x_train (5)"));
}

// Every refusal names its field, answers its code, and changes nothing on
// disk or served.
TEST(AppendRowsTest, BadAppendsAreRefusedAndChangeNothing) {
  const std::string dir = TempDir("attnserve-append");
  ModelRepository::Options options = OptionsFor(dir);
  options.max_grown_model_bytes = 4096;
  auto repository = LoadModelRepository(options).value();
  ModelCatalogue catalogue(repository.get(),
                           ModelControl{false, /*needs_permission=*/true, {}});
  const Rows seed = MakeRows(0, 3);
  ASSERT_TRUE(catalogue.Append(true, "m", seed.key_view(), seed.value_view(),
                               MemorySettings{})
                  .ok());
  ASSERT_TRUE(repository
                  ->SaveModel({"test", "weights"}, "additive",
                              [] {
                                RepositoryModel model;
                                model.config.set_name("additive");
                                model.config.set_backend("additive_attention");
                                model.tensors["W_q"] = attn::Tensor::Zeros({2, 2});
                                model.tensors["W_k"] = attn::Tensor::Zeros({2, 2});
                                model.tensors["w_v"] = attn::Tensor::Zeros({2});
                                return model;
                              }())
                  .ok());
  const std::set<std::string> files = Entries(dir + "/m");

  const Rows one = MakeRows(3, 1);
  std::vector<float> nan_keys = one.keys;
  nan_keys[1] = std::nanf("");
  std::vector<float> wide(kD + 1, 0.0f), empty;
  const Rows many = MakeRows(3, 200);  // 200 * 24 bytes: over 4096
  struct Case {
    std::string what;
    std::string name;
    attn::TensorView keys, values;
    bool may_append;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"NaN", "m", {nan_keys.data(), {1, kD}}, one.value_view(), true,
       absl::StatusCode::kInvalidArgument, "keys: element 1 is nan"},
      {"wrong d", "m", {wide.data(), {1, kD + 1}}, one.value_view(), true,
       absl::StatusCode::kInvalidArgument,
       "keys: shape (1, 5) must be (n, 4): model 'm' holds keys (3, 4)"},
      {"wrong v", "m", one.key_view(), {wide.data(), {1, 3}}, true,
       absl::StatusCode::kInvalidArgument, "values: shape (1, 3) must be (n, 2)"},
      {"mismatched n", "m", seed.key_view(), one.value_view(), true,
       absl::StatusCode::kInvalidArgument,
       "values: shape (1, 2) must have 3 rows, as keys (3, 4)"},
      {"empty", "m", {empty.data(), {0, kD}}, {empty.data(), {0, kV}}, true,
       absl::StatusCode::kInvalidArgument, "with n >= 1 (an empty append)"},
      {"unset", "m", {}, {}, true, absl::StatusCode::kInvalidArgument,
       "keys: shape () must be (n, 4)"},
      {"unknown", "nobody", one.key_view(), one.value_view(), true,
       absl::StatusCode::kNotFound, "name: no model 'nobody'"},
      {"built in", "dot_product_attention", one.key_view(), one.value_view(),
       true, absl::StatusCode::kInvalidArgument, "is a built-in model"},
      {"no rows", "additive", one.key_view(), one.value_view(), true,
       absl::StatusCode::kInvalidArgument, "holds no rows to append to"},
      {"bad name", "../m", one.key_view(), one.value_view(), true,
       absl::StatusCode::kInvalidArgument, "name: '../m' must be"},
      {"over the limit", "m", many.key_view(), many.value_view(), true,
       absl::StatusCode::kResourceExhausted, "(--max_grown_model_bytes)"},
      {"no permission", "m", one.key_view(), one.value_view(), false,
       absl::StatusCode::kPermissionDenied, "permission append"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    absl::StatusOr<ModelRepository::Appended> refused = catalogue.Append(
        c.may_append, c.name, c.keys, c.values, std::nullopt);
    EXPECT_EQ(refused.status().code(), c.code) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(c.message));
    EXPECT_THAT(std::string(refused.status().message()), Not(HasSubstr(dir)));
    EXPECT_EQ(CheckedRows(*repository->Find("m")), 3);
    EXPECT_EQ(Entries(dir + "/m"), files);
  }
  EXPECT_EQ(Entries(dir), (std::set<std::string>{"additive", "m"}));
  EXPECT_EQ(RowsAfterRestart(dir), 3);

  // A folder that is not served is not appended to, nor made anew.
  ASSERT_TRUE(repository->UnloadModel("m").ok());
  absl::StatusOr<ModelRepository::Appended> unloaded = Append(catalogue, 3, 1);
  EXPECT_EQ(unloaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unloaded.status().message()),
              HasSubstr("is not served"));
  EXPECT_EQ(Entries(dir + "/m"), files);

  // Without a repository there is nowhere to append.
  ModelCatalogue no_repository(nullptr);
  EXPECT_EQ(Append(no_repository, 0, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Evictions (issue #47): the oldest rows go, durably; rows keep their order
// and appends go on after them, numbered from what is left; a version held
// before keeps its rows; a whole save starts afresh.
TEST(EvictRowsTest, TheOldestRowsGoAndStayGone) {
  const std::string dir = TempDir("attnserve-append");
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get());
  ASSERT_TRUE(Append(catalogue, 0, 10).ok());
  std::shared_ptr<const RepositoryModel> before = repository->Find("m");
  absl::StatusOr<ModelRepository::Evicted> evicted =
      catalogue.Evict(true, "m", 3);
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(evicted->evicted, 3);
  EXPECT_EQ(evicted->rows, 7);
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 3), 7);
  EXPECT_EQ(CheckedRows(*before), 10);
  EXPECT_EQ(RowsAfterRestart(dir, 3), 7);
  // Appends number from what is left: rows 10 and 11 are now 7 and 8.
  absl::StatusOr<ModelRepository::Appended> appended =
      Append(catalogue, 10, 2, /*create=*/false);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->first_row, 7);
  EXPECT_EQ(appended->rows, 9);
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 3), 9);
  ASSERT_TRUE(catalogue.Evict(true, "m", 4).ok());
  ASSERT_TRUE(Append(catalogue, 12, 1, /*create=*/false).ok());
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 7), 6);
  EXPECT_EQ(RowsAfterRestart(dir, 7), 6);
  // One record on disk: the newest says it all.
  int records = 0;
  for (const std::string& file : Entries(dir + "/m")) {
    records += file.rfind("evicted-", 0) == 0;
  }
  EXPECT_EQ(records, 1);
  // Reloaded, it evicts and appends on from the same rows.
  ASSERT_TRUE(repository->LoadModel("m").ok());
  ASSERT_TRUE(catalogue.Evict(true, "m", 1).ok());
  ASSERT_TRUE(Append(catalogue, 13, 1, /*create=*/false).ok());
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 8), 6);
  EXPECT_EQ(RowsAfterRestart(dir, 8), 6);
  // Refused, naming the field: the memory keeps its rows.
  for (const auto& [oldest, name, code, message] :
       {std::tuple<int64_t, const char*, absl::StatusCode, const char*>{
            0, "m", absl::StatusCode::kInvalidArgument,
            "oldest: 0 must be in [1, 5]"},
        {6, "m", absl::StatusCode::kInvalidArgument,
         "keeps at least one"},
        {1, "nobody", absl::StatusCode::kNotFound, "no model 'nobody'"},
        {1, "masked_softmax", absl::StatusCode::kInvalidArgument,
         "built-in"}}) {
    absl::StatusOr<ModelRepository::Evicted> refused =
        catalogue.Evict(true, name, oldest);
    EXPECT_EQ(refused.status().code(), code) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(message));
  }
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 8), 6);
  // A whole save replaces the rows and the eviction with them.
  const Rows whole = MakeRows(0, 4);
  ASSERT_TRUE(repository
                  ->SaveModel({"load", "memory"}, "m",
                              NewAttentionMemory("m", {}, whole.key_view(),
                                                 whole.value_view())
                                  .value())
                  .ok());
  EXPECT_EQ(RowsAfterRestart(dir), 4);
  EXPECT_EQ(Entries(dir + "/m"),
            (std::set<std::string>{"config.pbtxt", "weights.safetensors"}));
}

// A max_rows window (issue #47): the newest rows stay, each append
// dropping the oldest beyond them; a restart leaves out the same rows
// without any record of them; explicit evictions go with it.
TEST(EvictRowsTest, AMaxRowsWindowKeepsTheNewestRows) {
  const std::string dir = TempDir("attnserve-append");
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get());
  MemorySettings window;
  window.max_rows = 5;
  auto append = [&](int64_t first, int64_t n) {
    const Rows rows = MakeRows(first, n);
    return catalogue.Append(true, "m", rows.key_view(), rows.value_view(),
                            window);
  };
  // Made with 8 rows: the last 5 kept.
  absl::StatusOr<ModelRepository::Appended> appended = append(0, 8);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->rows, 5);
  EXPECT_EQ(appended->evicted, 3);
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 3), 5);
  EXPECT_EQ(repository->Find("m")->config.parameters().at("max_rows").string_value(),
            "5");
  for (const auto& [first, n, first_row, evicted, oldest] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{8, 2, 3, 2, 5},
        {10, 7, 0, 7, 12},  // more than the window: its last 5
        {17, 1, 4, 1, 13}}) {
    SCOPED_TRACE(first);
    appended = append(first, n);
    ASSERT_TRUE(appended.ok()) << appended.status();
    EXPECT_EQ(appended->first_row, first_row);
    EXPECT_EQ(appended->rows, 5);
    EXPECT_EQ(appended->evicted, evicted);
    EXPECT_EQ(CheckedRows(*repository->Find("m"), oldest), 5);
    EXPECT_EQ(RowsAfterRestart(dir, oldest), 5);
  }
  // An explicit eviction narrows it further; the window applies after it.
  ASSERT_TRUE(catalogue.Evict(true, "m", 3).ok());
  EXPECT_EQ(RowsAfterRestart(dir, 16), 2);
  ASSERT_TRUE(append(18, 1).ok());
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 16), 3);
  EXPECT_EQ(RowsAfterRestart(dir, 16), 3);
  ASSERT_TRUE(append(19, 4).ok());
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 18), 5);
  EXPECT_EQ(RowsAfterRestart(dir, 18), 5);
  // Other settings than the memory's are refused, naming the window.
  window.max_rows = 6;
  absl::StatusOr<ModelRepository::Appended> refused = append(23, 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("max_rows 5, not"));
  // A memory saved whole must fit its window, and name a number.
  const Rows three = MakeRows(0, 3);
  for (const char* max_rows : {"2", "many", "0"}) {
    RepositoryModel model =
        NewAttentionMemory("w", {}, three.key_view(), three.value_view()).value();
    (*model.config.mutable_parameters())["max_rows"].set_string_value(max_rows);
    const absl::Status status =
        repository->SaveModel({"load", "memory"}, "w", std::move(model));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << max_rows;
    EXPECT_THAT(std::string(status.message()), HasSubstr("'max_rows'"));
  }
}

TEST(EvictRowsTest, ATrainingSetLosesItsOldestPointsAndWeightsOnlyModelsNone) {
  const std::string dir = TempDir("attnserve-append");
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get(),
                           ModelControl{false, /*needs_permission=*/true, {}});
  const float x[] = {0.5f, 1.5f, 2.5f}, y[] = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE(catalogue
                  .SaveFittedModel("nw", 2.0f, attn::TensorView{x, {3}},
                                   attn::TensorView{y, {3}})
                  .ok());
  ASSERT_TRUE(catalogue.Evict(true, "nw", 2).ok());
  auto reloaded = LoadModelRepository(OptionsFor(dir)).value();
  for (auto* repo : {repository.get(), reloaded.get()}) {
    const auto values = repo->Find("nw")->tensors.at("x_train").values();
    EXPECT_EQ(std::vector<float>(values.begin(), values.end()),
              std::vector<float>{2.5f});
    EXPECT_EQ(repo->Find("nw")->tensors.at("y_train").values()[0], 3.0f);
  }
  ASSERT_TRUE(repository
                  ->SaveModel({"test", "a fit"}, "bandwidth_only",
                              FittedNadarayaWatsonModel("bandwidth_only", 1.0f))
                  .ok());
  absl::StatusOr<ModelRepository::Evicted> refused =
      catalogue.Evict(true, "bandwidth_only", 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("holds no rows to evict"));
  refused = catalogue.Evict(false, "nw", 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("evict: this token may not"));
}

int StepsOfAnAppend() {
  const std::string dir = TempDir("attnserve-append");
  FaultInjectionFileSystem fs(DefaultFileSystem());
  auto repository = Seeded(dir, &fs);
  ModelCatalogue catalogue(repository.get());
  const int before = fs.steps();
  EXPECT_TRUE(Append(catalogue, 3, 2, /*create=*/false).ok());
  return fs.steps() - before;
}

// Every step of an append failing once, in turn, with a full disk, an I/O
// error or a read-only file system: the append fails with that code, names the model and no
// server path, and the memory served and on disk keeps its 3 rows, with no
// file left behind; or (only a step after the commit) answers OK with 5.
TEST(AppendFaultTest, AnyStepFailingChangesNothing) {
  const int steps = StepsOfAnAppend();
  ASSERT_GE(steps, 6);  // new file, write, fsync, close, rename, fsync folder
  // A read-only repository (a ConfigMap volume) too.
  for (int error : {ENOSPC, EIO, EROFS}) {
    for (int failing = 0; failing < steps; ++failing) {
      SCOPED_TRACE(::testing::Message() << std::strerror(error) << ", step "
                                        << failing << " of " << steps);
      const std::string dir = TempDir("attnserve-append");
      FaultInjectionFileSystem fs(DefaultFileSystem());
      auto repository = Seeded(dir, &fs);
      ModelCatalogue catalogue(repository.get());
      const std::set<std::string> files = Entries(dir + "/m");
      const int first = fs.steps();
      fs.SetFault([&](const FaultInjectionFileSystem::Step& step) {
        return step.index == first + failing ? error : 0;
      });
      absl::StatusOr<ModelRepository::Appended> appended =
          Append(catalogue, 3, 2, /*create=*/false);
      fs.SetFault(nullptr);
      if (appended.ok()) {
        EXPECT_EQ(CheckedRows(*repository->Find("m")), 5);
        EXPECT_EQ(RowsAfterRestart(dir), 5);
        continue;
      }
      EXPECT_EQ(appended.status().code(),
                error == ENOSPC   ? absl::StatusCode::kResourceExhausted
                : error == EROFS  ? absl::StatusCode::kFailedPrecondition
                                  : absl::StatusCode::kInternal)
          << appended.status();
      EXPECT_THAT(std::string(appended.status().message()),
                  HasSubstr("append 'm'"));
      EXPECT_THAT(std::string(appended.status().message()),
                  HasSubstr("the model is unchanged"));
      EXPECT_THAT(std::string(appended.status().message()), Not(HasSubstr(dir)));
      EXPECT_EQ(CheckedRows(*repository->Find("m")), 3);
      EXPECT_EQ(Entries(dir + "/m"), files);
      EXPECT_EQ(RowsAfterRestart(dir), 3);
      // The next append works and numbers after what is there.
      appended = Append(catalogue, 3, 1, /*create=*/false);
      ASSERT_TRUE(appended.ok()) << appended.status();
      EXPECT_EQ(RowsAfterRestart(dir), 4);
    }
  }
}

// The same for an eviction of a memory of 5 rows (3 evicted before): each
// step failing leaves the 4 rows; OK means 2, for good.
TEST(AppendFaultTest, AnyStepOfAnEvictionFailingChangesNothing) {
  auto seeded = [](const std::string& dir, FileSystem* fs) {
    auto repository = Seeded(dir, fs);
    ModelCatalogue catalogue(repository.get());
    EXPECT_TRUE(Append(catalogue, 3, 2, /*create=*/false).ok());
    EXPECT_TRUE(catalogue.Evict(true, "m", 1).ok());
    return repository;
  };
  int steps = 0;
  {
    const std::string dir = TempDir("attnserve-append");
    FaultInjectionFileSystem fs(DefaultFileSystem());
    auto repository = seeded(dir, &fs);
    const int before = fs.steps();
    ASSERT_TRUE(ModelCatalogue(repository.get()).Evict(true, "m", 2).ok());
    steps = fs.steps() - before;
  }
  ASSERT_GE(steps, 6);
  for (int failing = 0; failing < steps; ++failing) {
    SCOPED_TRACE(::testing::Message() << "step " << failing << " of " << steps);
    const std::string dir = TempDir("attnserve-append");
    FaultInjectionFileSystem fs(DefaultFileSystem());
    auto repository = seeded(dir, &fs);
    ModelCatalogue catalogue(repository.get());
    const int first = fs.steps();
    fs.SetFault([&](const FaultInjectionFileSystem::Step& step) {
      return step.index == first + failing ? EIO : 0;
    });
    absl::StatusOr<ModelRepository::Evicted> evicted =
        catalogue.Evict(true, "m", 2);
    fs.SetFault(nullptr);
    if (evicted.ok()) {  // only the removal of the record before
      EXPECT_EQ(CheckedRows(*repository->Find("m"), 3), 2);
      EXPECT_EQ(RowsAfterRestart(dir, 3), 2);
      continue;
    }
    EXPECT_EQ(evicted.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(evicted.status().message()),
                HasSubstr("evict 'm'"));
    EXPECT_EQ(CheckedRows(*repository->Find("m"), 1), 4);
    EXPECT_EQ(RowsAfterRestart(dir, 1), 4);
  }
  // Crashes before each step: 4 rows or 2, never anything else.
  for (bool power_cut : {false, true}) {
    for (int crash = 0; crash <= steps; ++crash) {
      SCOPED_TRACE(::testing::Message() << "crash before step " << crash
                                        << (power_cut ? ", power cut" : ""));
      const std::string dir = TempDir("attnserve-append");
      FaultInjectionFileSystem fs(DefaultFileSystem());
      auto repository = seeded(dir, &fs);
      if (power_cut) {
        ASSERT_TRUE(fs.DropUnsyncedData().ok());
      }
      fs.CrashAfter(fs.steps() + crash);
      absl::StatusOr<ModelRepository::Evicted> evicted =
          ModelCatalogue(repository.get()).Evict(true, "m", 2);
      const bool completed = !fs.crashed();
      if (power_cut) {
        ASSERT_TRUE(fs.DropUnsyncedData().ok());
      }
      const int64_t after = RowsAfterRestart(dir, 3);
      if (completed) {
        ASSERT_TRUE(evicted.ok()) << evicted.status();
        EXPECT_EQ(after, 2);
      } else {
        EXPECT_TRUE(after == 2 || RowsAfterRestart(dir, 1) == 4);
      }
    }
  }
}

// kill -9 (the disk as it is) or a power cut (what was not fsynced lost)
// before each step of an append in turn: the restart always works and
// finds the 3 rows before or all 5 after, never a part, and all 5 whenever
// the append had answered OK. The hidden file a kill leaves is removed.
class AppendCrashTest : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(KillAndPowerCut, AppendCrashTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "PowerCut" : "Kill";
                         });

TEST_P(AppendCrashTest, RestartFindsTheRowsBeforeOrAfterWhole) {
  const bool power_cut = GetParam();
  int befores = 0, afters = 0;
  for (int crash = 0;; ++crash) {
    SCOPED_TRACE(::testing::Message() << "crash before step " << crash);
    const std::string dir = TempDir("attnserve-append");
    FaultInjectionFileSystem fs(DefaultFileSystem());
    auto repository = Seeded(dir, &fs);
    ModelCatalogue catalogue(repository.get());
    fs.CrashAfter(fs.steps() + crash);
    absl::StatusOr<ModelRepository::Appended> appended =
        Append(catalogue, 3, 2, /*create=*/false);
    const bool completed = !fs.crashed();
    if (completed) {
      ASSERT_TRUE(appended.ok()) << appended.status();
    }
    if (power_cut) {
      ASSERT_TRUE(fs.DropUnsyncedData().ok());
    }
    const int64_t rows = RowsAfterRestart(dir);
    if (completed) {
      EXPECT_EQ(rows, 5) << "answered OK, lost by the "
                         << (power_cut ? "power cut" : "kill");
    } else {
      EXPECT_TRUE(rows == 3 || rows == 5) << rows;
    }
    (rows == 5 ? afters : befores) += 1;
    for (const std::string& file : Entries(dir + "/m")) {
      EXPECT_NE(file[0], '.') << file << " left after the restart";
    }
    if (completed) break;
    ASSERT_LT(crash, 50);
  }
  EXPECT_GT(befores, 0);
  EXPECT_GT(afters, 0);
}

}  // namespace
}  // namespace attnserve

// Compaction (issue #47): a memory's rows files and eviction records folded
// into one base file while it serves. What is served never changes, a
// restart at any instant (after a kill, a power cut, a failed step) finds
// the same rows, appends and evictions after a base count from it, and a
// compaction the model changed under gives way. Its races with appends,
// reloads and unloads under ThreadSanitizer are in
// tests/sanitizers/concurrency_test.cc.
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

// The files of memory m's folder, hidden ones too.
std::set<std::string> Files(const std::string& dir) {
  return Entries(dir + "/m");
}

// Memory m of `n` rows made by one append and `appends` more of one row
// each: `appends` rows files after weights.safetensors.
void Grow(ModelCatalogue& catalogue, int64_t n, int appends) {
  ASSERT_TRUE(Append(catalogue, 0, n).ok());
  for (int i = 0; i < appends; ++i) {
    ASSERT_TRUE(Append(catalogue, n + i, 1, /*create=*/false).ok());
  }
}

// Memory m of rows 0 to n - 1 that keeps its newest `max_rows`.
void MakeWindowed(ModelCatalogue& catalogue, int64_t n, int64_t max_rows) {
  MemorySettings window;
  window.max_rows = max_rows;
  const Rows rows = MakeRows(0, n);
  ASSERT_TRUE(
      catalogue.Append(true, "m", rows.key_view(), rows.value_view(), window)
          .ok());
}

TEST(CompactionTest, FoldsRowsFilesAndEvictionsIntoOneBase) {
  const std::string dir = TempDir("attnserve-compact");
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get());
  Grow(catalogue, 3, 4);  // rows 0-6
  ASSERT_TRUE(catalogue.Evict(true, "m", 2).ok());  // rows 2-6
  const std::shared_ptr<const RepositoryModel> before = repository->Find("m");
  ASSERT_EQ(CheckedRows(*before, 2), 5);

  absl::StatusOr<ModelRepository::Compacted> compacted =
      repository->CompactRows("m");
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  EXPECT_TRUE(compacted->compacted);
  EXPECT_EQ(compacted->base_file, 1u);
  EXPECT_EQ(compacted->rows_files, 4);
  EXPECT_EQ(compacted->evicted_rows, 2);
  EXPECT_EQ(Files(dir), (std::set<std::string>{"base-00000001.safetensors",
                                               "config.pbtxt"}));
  // Served as before: the same rows where they were, the same memory.
  const std::shared_ptr<const RepositoryModel> after = repository->Find("m");
  EXPECT_EQ(CheckedRows(*after, 2), 5);
  EXPECT_EQ(after->tensors.at("keys").parts().front().data,
            before->tensors.at("keys").parts().front().data);
  EXPECT_EQ(after->tensors.at("keys").parts().back().data,
            before->tensors.at("keys").parts().back().data);
  EXPECT_EQ(after->held_memory, before->held_memory);
  EXPECT_EQ(after->appended_files, 0);
  EXPECT_EQ(after->evicted_rows, 0);
  EXPECT_EQ(after->stored_bytes, compacted->bytes);
  EXPECT_EQ(CheckedRows(*before, 2), 5);  // a call holding it keeps its rows
  EXPECT_EQ(RowsAfterRestart(dir, 2), 5);

  // Appends and an eviction after the base count from it, before and after
  // a restart, and a second compaction replaces the first base.
  ASSERT_TRUE(Append(catalogue, 7, 2, /*create=*/false).ok());  // rows 2-8
  ASSERT_TRUE(catalogue.Evict(true, "m", 3).ok());               // rows 5-8
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 5), 4);
  EXPECT_EQ(RowsAfterRestart(dir, 5), 4);
  compacted = repository->CompactRows("m");
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  EXPECT_EQ(compacted->base_file, 2u);
  EXPECT_EQ(compacted->rows_files, 1);
  EXPECT_EQ(compacted->evicted_rows, 3);
  EXPECT_EQ(Files(dir), (std::set<std::string>{"base-00000002.safetensors",
                                               "config.pbtxt"}));
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 5), 4);
  EXPECT_EQ(RowsAfterRestart(dir, 5), 4);

  // A restart serves the base itself, and grows and compacts from there.
  auto restarted = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue again(restarted.get());
  ASSERT_TRUE(Append(again, 9, 1, /*create=*/false).ok());  // rows 5-9
  ASSERT_TRUE(again.Evict(true, "m", 1).ok());               // rows 6-9
  EXPECT_EQ(CheckedRows(*restarted->Find("m"), 6), 4);
  ASSERT_TRUE(restarted->CompactRows("m").ok());
  EXPECT_EQ(CheckedRows(*restarted->Find("m"), 6), 4);
  EXPECT_EQ(RowsAfterRestart(dir, 6), 4);
}

TEST(CompactionTest, NothingToFoldAndUnknownModels) {
  const std::string dir = TempDir("attnserve-compact");
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get());
  ASSERT_TRUE(Append(catalogue, 0, 3).ok());
  const std::set<std::string> files = Files(dir);
  absl::StatusOr<ModelRepository::Compacted> compacted =
      repository->CompactRows("m");
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  EXPECT_FALSE(compacted->compacted);
  EXPECT_EQ(Files(dir), files);
  EXPECT_EQ(repository->CompactRows("other").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(repository->CompactRows("../m").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A window of the newest rows holds across a base: the base keeps the
// window as served, and a load applies it to the base and the rows files
// after it.
TEST(CompactionTest, AMaxRowsWindowHoldsAcrossABase) {
  const std::string dir = TempDir("attnserve-compact");
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get());
  MakeWindowed(catalogue, 3, /*max_rows=*/5);
  for (int64_t at = 3; at < 9; at += 2) {
    ASSERT_TRUE(Append(catalogue, at, 2, /*create=*/false).ok());
  }
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 4), 5);  // rows 4-8
  ASSERT_TRUE(repository->CompactRows("m").ok());
  EXPECT_EQ(RowsAfterRestart(dir, 4), 5);
  ASSERT_TRUE(Append(catalogue, 9, 3, /*create=*/false).ok());  // rows 7-11
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 7), 5);
  EXPECT_EQ(RowsAfterRestart(dir, 7), 5);
  ASSERT_TRUE(repository->CompactRows("m").ok());
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 7), 5);
  EXPECT_EQ(RowsAfterRestart(dir, 7), 5);
}

// A memory grown past --max_model_bytes by appends is folded into a base
// that a load reads under --max_grown_model_bytes; a base over that is
// refused, naming it.
TEST(CompactionTest, ABaseIsBoundedByTheGrownLimit) {
  const std::string dir = TempDir("attnserve-compact");
  ModelRepository::Options options = OptionsFor(dir);
  options.max_model_bytes = 400;
  options.max_grown_model_bytes = 4000;
  {
    auto repository = LoadModelRepository(options).value();
    ModelCatalogue catalogue(repository.get());
    ASSERT_TRUE(Append(catalogue, 0, 3).ok());
    ASSERT_TRUE(Append(catalogue, 3, 20, /*create=*/false).ok());
    absl::StatusOr<ModelRepository::Compacted> compacted =
        repository->CompactRows("m");
    ASSERT_TRUE(compacted.ok()) << compacted.status();
    EXPECT_GT(compacted->bytes, options.max_model_bytes);
  }
  auto reloaded = LoadModelRepository(options);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(CheckedRows(*(*reloaded)->Find("m")), 23);
  options.max_grown_model_bytes = 500;
  reloaded = LoadModelRepository(options);
  EXPECT_EQ(reloaded.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(reloaded.status().message()),
              HasSubstr("m/base-00000001.safetensors"));
  EXPECT_THAT(std::string(reloaded.status().message()),
              HasSubstr("--max_grown_model_bytes"));
}

// A file system that runs `hook` when a base's hidden file is fsynced:
// between the base written and its commit, with no lock of the
// repository held.
class HookedFileSystem : public FileSystem {
 public:
  explicit HookedFileSystem(std::function<void()> hook)
      : base_(DefaultFileSystem()), hook_(std::move(hook)) {}

  absl::StatusOr<std::string> ReadFile(const std::string& path,
                                       int64_t max_bytes) override {
    return base_->ReadFile(path, max_bytes);
  }
  absl::StatusOr<std::shared_ptr<const FileBytes>> MapFile(
      const std::string& path, int64_t max_bytes) override {
    return base_->MapFile(path, max_bytes);
  }
  absl::StatusOr<std::vector<Entry>> ListDir(const std::string& path) override {
    return base_->ListDir(path);
  }
  absl::StatusOr<Entry> Stat(const std::string& path) override {
    return base_->Stat(path);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    absl::StatusOr<std::unique_ptr<WritableFile>> file =
        base_->NewWritableFile(path);
    if (!file.ok() || path.find("/.base-") == std::string::npos) return file;
    return std::unique_ptr<WritableFile>(
        new HookedFile(*std::move(file), hook_));
  }
  absl::Status CreateDir(const std::string& path) override {
    return base_->CreateDir(path);
  }
  absl::Status SyncDir(const std::string& path) override {
    return base_->SyncDir(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  absl::Status Exchange(const std::string& a, const std::string& b) override {
    return base_->Exchange(a, b);
  }
  absl::Status RemoveFile(const std::string& path) override {
    return base_->RemoveFile(path);
  }
  absl::Status RemoveDir(const std::string& path) override {
    return base_->RemoveDir(path);
  }
  absl::StatusOr<std::unique_ptr<ScratchFile>> NewScratchFile(
      const std::string& dir) override {
    return base_->NewScratchFile(dir);
  }

 private:
  class HookedFile : public WritableFile {
   public:
    HookedFile(std::unique_ptr<WritableFile> file, std::function<void()> hook)
        : file_(std::move(file)), hook_(std::move(hook)) {}
    absl::Status Append(absl::string_view data) override {
      return file_->Append(data);
    }
    absl::Status Sync() override {
      if (hook_) hook_();
      return file_->Sync();
    }
    absl::Status Close() override { return file_->Close(); }

   private:
    std::unique_ptr<WritableFile> file_;
    std::function<void()> hook_;
  };

  FileSystem* const base_;
  const std::function<void()> hook_;
};

// A first-in-first-out memory: once the rows its window dropped from the
// front of the scratch files are as many as it serves, a compaction copies
// the rows served into fresh ones (so the files do not grow for ever) and
// serves them as a new memory; rows appended while the base was written
// come along. Before that, nothing moves.
TEST(CompactionTest, AWindowedMemoryLeavesItsEvictedRowsBehind) {
  for (const bool append_meanwhile : {false, true}) {
    SCOPED_TRACE(append_meanwhile ? "an append while the base is written"
                                  : "alone");
    const std::string dir = TempDir("attnserve-compact");
    ModelCatalogue* catalogue_seen = nullptr;
    bool armed = false;
    HookedFileSystem fs([&] {
      if (!armed) return;
      armed = false;
      ASSERT_TRUE(Append(*catalogue_seen, 12, 2, /*create=*/false).ok());
    });
    auto repository = LoadModelRepository(OptionsFor(dir, &fs)).value();
    ModelCatalogue catalogue(repository.get());
    catalogue_seen = &catalogue;
    MakeWindowed(catalogue, 4, /*max_rows=*/4);
    ASSERT_TRUE(Append(catalogue, 4, 3, /*create=*/false).ok());  // rows 3-6
    // 3 dropped, 4 served: nothing moves yet.
    absl::StatusOr<ModelRepository::Compacted> compacted =
        repository->CompactRows("m");
    ASSERT_TRUE(compacted.ok()) << compacted.status();
    EXPECT_EQ(compacted->rows_moved, 0);
    for (int64_t at = 7; at < 12; ++at) {  // rows 8-11; 8 dropped in all
      ASSERT_TRUE(Append(catalogue, at, 1, /*create=*/false).ok());
    }
    const std::shared_ptr<const RepositoryModel> before = repository->Find("m");
    armed = append_meanwhile;
    compacted = repository->CompactRows("m");
    ASSERT_TRUE(compacted.ok()) << compacted.status();
    const int64_t first_row = append_meanwhile ? 10 : 8;
    EXPECT_EQ(compacted->rows_moved, append_meanwhile ? 6 : 4);
    const std::shared_ptr<const RepositoryModel> after = repository->Find("m");
    EXPECT_EQ(CheckedRows(*after, first_row), 4);
    EXPECT_NE(after->tensors.at("keys").parts().back().data,
              before->tensors.at("keys").parts().back().data);
    EXPECT_NE(after->lineage, before->lineage);
    EXPECT_NE(after->held_memory, before->held_memory);
    EXPECT_EQ(CheckedRows(*before, 8), 4);  // a call holding it keeps its rows
    // Appends go on in the fresh files, and a restart agrees.
    const int64_t next = first_row + 4;
    ASSERT_TRUE(Append(catalogue, next, 1, /*create=*/false).ok());
    EXPECT_EQ(CheckedRows(*repository->Find("m"), first_row + 1), 4);
    EXPECT_EQ(RowsAfterRestart(dir, first_row + 1), 4);
  }
}

// What comes between a base's writing and its commit: a whole save, a
// reload or an unload aborts it, leaving no file; an append or an eviction
// does not, and its file stays beside the base (the eviction's record
// counting from the base before, which the new one's metadata names).
TEST(CompactionTest, AChangeWhileTheBaseIsWrittenAbortsItOrStaysBesideIt) {
  struct Case {
    std::string what;
    std::function<void(ModelRepository&, ModelCatalogue&)> change;
    bool aborts;
    std::string left_beside;  // the file the change made, when kept
    int64_t first_row;  // served after it
    int64_t rows;
  };
  const std::vector<Case> cases = {
      {"evict",
       [](ModelRepository&, ModelCatalogue& catalogue) {
         ASSERT_TRUE(catalogue.Evict(true, "m", 1).ok());
       },
       false, "evicted-00000002", 2, 4},
      {"append",
       [](ModelRepository&, ModelCatalogue& catalogue) {
         ASSERT_TRUE(Append(catalogue, 6, 2, /*create=*/false).ok());
       },
       false, "rows-00000004.safetensors", 1, 7},
      {"reload",
       [](ModelRepository& repository, ModelCatalogue&) {
         ASSERT_TRUE(repository.LoadModel("m").ok());
       },
       true, "", 1, 5},
      {"whole save",
       [](ModelRepository& repository, ModelCatalogue&) {
         const Rows rows = MakeRows(0, 2);
         ASSERT_TRUE(repository
                         .SaveModel({"test", "a memory"}, "m",
                                    NewAttentionMemory("m", MemorySettings{},
                                                       rows.key_view(),
                                                       rows.value_view())
                                        .value())
                         .ok());
       },
       true, "", 0, 2},
      {"unload",
       [](ModelRepository& repository, ModelCatalogue&) {
         ASSERT_TRUE(repository.UnloadModel("m").ok());
       },
       true, "", 1, 5},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.what);
    const std::string dir = TempDir("attnserve-compact");
    ModelRepository* repository_seen = nullptr;
    ModelCatalogue* catalogue_seen = nullptr;
    bool ran = false;
    HookedFileSystem fs([&] {
      if (ran) return;
      ran = true;
      test.change(*repository_seen, *catalogue_seen);
    });
    auto repository = LoadModelRepository(OptionsFor(dir, &fs)).value();
    ModelCatalogue catalogue(repository.get());
    repository_seen = repository.get();
    catalogue_seen = &catalogue;
    ran = true;  // not while growing
    Grow(catalogue, 3, 3);                             // rows 0-5
    ASSERT_TRUE(catalogue.Evict(true, "m", 1).ok());  // rows 1-5
    ran = false;
    absl::StatusOr<ModelRepository::Compacted> compacted =
        repository->CompactRows("m");
    ASSERT_TRUE(ran);
    for (const std::string& file : Files(dir)) {
      EXPECT_NE(file[0], '.') << file << " left behind";
    }
    if (test.aborts) {
      EXPECT_EQ(compacted.status().code(), absl::StatusCode::kAborted)
          << compacted.status();
      EXPECT_THAT(std::string(compacted.status().message()),
                  HasSubstr("the model is unchanged"));
      for (const std::string& file : Files(dir)) {
        EXPECT_EQ(file.rfind("base-", 0), std::string::npos) << file;
      }
    } else {
      ASSERT_TRUE(compacted.ok()) << compacted.status();
      EXPECT_EQ(compacted->rows_files, 3);
      EXPECT_EQ(Files(dir),
                (std::set<std::string>{"base-00000001.safetensors",
                                       "config.pbtxt", test.left_beside}));
    }
    if (auto served = repository->Find("m"); served != nullptr) {
      EXPECT_EQ(CheckedRows(*served, test.first_row), test.rows);
    }
    EXPECT_EQ(RowsAfterRestart(dir, test.first_row), test.rows);
    if (!test.aborts) {
      // Changes after the base count from it, before and after a restart,
      // and the next compaction folds them all.
      ASSERT_TRUE(Append(catalogue, test.first_row + test.rows, 1,
                         /*create=*/false)
                      .ok());
      ASSERT_TRUE(catalogue.Evict(true, "m", 2).ok());
      EXPECT_EQ(CheckedRows(*repository->Find("m"), test.first_row + 2),
                test.rows - 1);
      EXPECT_EQ(RowsAfterRestart(dir, test.first_row + 2), test.rows - 1);
      ASSERT_TRUE(repository->CompactRows("m").ok());
      EXPECT_EQ(RowsAfterRestart(dir, test.first_row + 2), test.rows - 1);
    }
  }
}

// Memory m in `dir` holding rows 1-5 (three rows files, one eviction),
// served through `fs`.
std::unique_ptr<ModelRepository> GrownAndEvicted(const std::string& dir,
                                                 FileSystem* fs) {
  {
    auto seeding = LoadModelRepository(OptionsFor(dir)).value();
    ModelCatalogue catalogue(seeding.get());
    Grow(catalogue, 3, 3);
    EXPECT_TRUE(catalogue.Evict(true, "m", 1).ok());
  }
  return LoadModelRepository(OptionsFor(dir, fs)).value();
}

// After a restart on `dir` (which must hold rows 1-5), one more append and
// eviction count from wherever the rows now start: rows 2-6, served and
// after another restart.
void GrowsOnAfterRestart(const std::string& dir) {
  auto repository = LoadModelRepository(OptionsFor(dir)).value();
  ModelCatalogue catalogue(repository.get());
  ASSERT_TRUE(Append(catalogue, 6, 1, /*create=*/false).ok());
  ASSERT_TRUE(catalogue.Evict(true, "m", 1).ok());
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 2), 5);
  EXPECT_EQ(RowsAfterRestart(dir, 2), 5);
}

int StepsOfACompaction() {
  const std::string dir = TempDir("attnserve-compact");
  FaultInjectionFileSystem fs(DefaultFileSystem());
  auto repository = GrownAndEvicted(dir, &fs);
  const int before = fs.steps();
  EXPECT_TRUE(repository->CompactRows("m").ok());
  return fs.steps() - before;
}

// Every step of a compaction failing once, in turn, with a full disk, an
// I/O error or a read-only file system: it fails with that code, naming the
// model and no server path, or (a removal after the commit) answers OK;
// either way the rows served and after a restart are the same, nothing
// hidden is left, and the next compaction works.
TEST(CompactionFaultTest, AnyStepFailingChangesNothingServed) {
  const int steps = StepsOfACompaction();
  // new file, write, fsync, close, rename, fsync folder, 5 removals, fsync
  ASSERT_GE(steps, 12);
  for (int error : {ENOSPC, EIO, EROFS}) {
    for (int failing = 0; failing < steps; ++failing) {
      SCOPED_TRACE(::testing::Message() << std::strerror(error) << ", step "
                                        << failing << " of " << steps);
      const std::string dir = TempDir("attnserve-compact");
      FaultInjectionFileSystem fs(DefaultFileSystem());
      auto repository = GrownAndEvicted(dir, &fs);
      const int first = fs.steps();
      fs.SetFault([&](const FaultInjectionFileSystem::Step& step) {
        return step.index == first + failing ? error : 0;
      });
      absl::StatusOr<ModelRepository::Compacted> compacted =
          repository->CompactRows("m");
      fs.SetFault(nullptr);
      if (!compacted.ok()) {
        EXPECT_EQ(compacted.status().code(),
                  error == ENOSPC  ? absl::StatusCode::kResourceExhausted
                  : error == EROFS ? absl::StatusCode::kFailedPrecondition
                                   : absl::StatusCode::kInternal)
            << compacted.status();
        EXPECT_THAT(std::string(compacted.status().message()),
                    HasSubstr("compact 'm'"));
        EXPECT_THAT(std::string(compacted.status().message()),
                    Not(HasSubstr(dir)));
      }
      for (const std::string& file : Files(dir)) {
        EXPECT_NE(file[0], '.') << file << " left behind";
      }
      EXPECT_EQ(CheckedRows(*repository->Find("m"), 1), 5);
      EXPECT_EQ(RowsAfterRestart(dir, 1), 5);
      ASSERT_TRUE(repository->CompactRows("m").ok());
      EXPECT_EQ(RowsAfterRestart(dir, 1), 5);
      GrowsOnAfterRestart(dir);
    }
  }
}

// kill -9 (the disk as it is) or a power cut (what was not fsynced lost)
// before each step of a compaction in turn: the restart always works and
// finds the same rows, removes what the kill left hidden, and appends and
// evictions after it count right.
class CompactionCrashTest : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(KillAndPowerCut, CompactionCrashTest,
                         ::testing::Bool(), [](const auto& info) {
                           return info.param ? "PowerCut" : "Kill";
                         });

TEST_P(CompactionCrashTest, RestartFindsTheSameRows) {
  const bool power_cut = GetParam();
  int with_base = 0, without = 0;
  for (int crash = 0;; ++crash) {
    SCOPED_TRACE(::testing::Message() << "crash before step " << crash);
    const std::string dir = TempDir("attnserve-compact");
    FaultInjectionFileSystem fs(DefaultFileSystem());
    auto repository = GrownAndEvicted(dir, &fs);
    if (power_cut) {
      ASSERT_TRUE(fs.DropUnsyncedData().ok());
    }
    fs.CrashAfter(fs.steps() + crash);
    absl::StatusOr<ModelRepository::Compacted> compacted =
        repository->CompactRows("m");
    const bool completed = !fs.crashed();
    if (completed) {
      ASSERT_TRUE(compacted.ok()) << compacted.status();
    }
    if (power_cut) {
      ASSERT_TRUE(fs.DropUnsyncedData().ok());
    }
    repository.reset();
    bool had_base = false;
    for (const std::string& file : Files(dir)) {
      had_base |= file.rfind("base-", 0) == 0;
    }
    EXPECT_EQ(RowsAfterRestart(dir, 1), 5);
    // The restart removes what a kill left: hidden files, and the files a
    // durable base covers.
    const std::set<std::string> after = Files(dir);
    for (const std::string& file : after) {
      EXPECT_NE(file[0], '.') << file << " left after the restart";
    }
    if (had_base) {
      EXPECT_EQ(after, (std::set<std::string>{"base-00000001.safetensors",
                                              "config.pbtxt"}));
    }
    (had_base ? with_base : without) += 1;
    GrowsOnAfterRestart(dir);
    if (completed) break;
    ASSERT_LT(crash, 50);
  }
  EXPECT_GT(with_base, 0);
  EXPECT_GT(without, 0);
}

// In the background: once appends leave enough rows files holding as many
// bytes as the base, a compaction runs by itself and is reported; the
// rows stay exact meanwhile and after.
TEST(CompactionTest, RunsInTheBackgroundWhenDue) {
  const std::string dir = TempDir("attnserve-compact");
  ModelRepository::Options options = OptionsFor(dir);
  options.compaction.in_background = true;
  options.compaction.min_rows_files = 4;
  absl::Notification reported;
  absl::Status outcome = absl::UnknownError("not reported");
  options.compaction.on_done = [&](const std::string& model,
                                   const absl::Status& status, absl::Duration) {
    if (reported.HasBeenNotified()) return;
    EXPECT_EQ(model, "m");
    outcome = status;
    reported.Notify();
  };
  auto repository = LoadModelRepository(options).value();
  ModelCatalogue catalogue(repository.get());
  ASSERT_TRUE(Append(catalogue, 0, 8).ok());
  // Rows files of 2 rows each: 4 of them first hold as much as the base.
  for (int64_t at = 8; at < 16; at += 2) {
    EXPECT_FALSE(reported.HasBeenNotified()) << "compacted before it was due";
    ASSERT_TRUE(Append(catalogue, at, 2, /*create=*/false).ok());
  }
  ASSERT_TRUE(reported.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_TRUE(outcome.ok()) << outcome;
  EXPECT_EQ(CheckedRows(*repository->Find("m")), 16);
  EXPECT_TRUE(Files(dir).count("base-00000001.safetensors"));
  EXPECT_EQ(RowsAfterRestart(dir), 16);
}

// Evictions alone set one off too, once the rows evicted hold half of
// what the model's files hold: those rows then leave the disk.
TEST(CompactionTest, EvictionsSetOneOffOnceHalfTheBytesAreEvicted) {
  const std::string dir = TempDir("attnserve-compact");
  ModelRepository::Options options = OptionsFor(dir);
  options.compaction.in_background = true;
  absl::Notification reported;
  absl::Status outcome = absl::UnknownError("not reported");
  options.compaction.on_done = [&](const std::string&,
                                   const absl::Status& status, absl::Duration) {
    if (reported.HasBeenNotified()) return;
    outcome = status;
    reported.Notify();
  };
  auto repository = LoadModelRepository(options).value();
  ModelCatalogue catalogue(repository.get());
  ASSERT_TRUE(Append(catalogue, 0, 64).ok());
  ASSERT_TRUE(catalogue.Evict(true, "m", 20).ok());  // under a third
  EXPECT_FALSE(reported.WaitForNotificationWithTimeout(absl::Seconds(1)))
      << "compacted before it was due";
  ASSERT_TRUE(catalogue.Evict(true, "m", 20).ok());  // 40 of 64
  ASSERT_TRUE(reported.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_TRUE(outcome.ok()) << outcome;
  EXPECT_EQ(Files(dir), (std::set<std::string>{"base-00000001.safetensors",
                                               "config.pbtxt"}));
  EXPECT_EQ(CheckedRows(*repository->Find("m"), 40), 24);
  EXPECT_EQ(RowsAfterRestart(dir, 40), 24);
}

}  // namespace
}  // namespace attnserve

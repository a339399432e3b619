// For the tests of appends, evictions and compactions: a memory whose row
// i holds keys all i and values all -i, so that any row's place can be
// read back, and a repository over a folder of it.
// Test-only; thread-compatible (plain functions).
#ifndef ATTNSERVE_SERVER_MODELS_TEST_ROWS_H_
#define ATTNSERVE_SERVER_MODELS_TEST_ROWS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/models/model_catalogue.h"
#include "server/repository/model_repository.h"

namespace attnserve {

constexpr int64_t kD = 4;  // key width
constexpr int64_t kV = 2;  // value width

// Rows [first, first + n) of a memory whose row i has keys all i and
// values all -i: any row's place can be read back from its values.
struct Rows {
  std::vector<float> keys, values;
  attn::TensorView key_view() const {
    return {keys.data(), {static_cast<int64_t>(keys.size()) / kD, kD}};
  }
  attn::TensorView value_view() const {
    return {values.data(), {static_cast<int64_t>(values.size()) / kV, kV}};
  }
};
inline Rows MakeRows(int64_t first, int64_t n) {
  Rows rows;
  for (int64_t i = first; i < first + n; ++i) {
    rows.keys.insert(rows.keys.end(), kD, static_cast<float>(i));
    rows.values.insert(rows.values.end(), kV, -static_cast<float>(i));
  }
  return rows;
}

// The number of rows of the memory `model` holds, checking row i holds
// index first + i (MakeRows; first: the rows evicted) exactly: -1 when one
// does not, or keys and values disagree.
inline int64_t CheckedRows(const RepositoryModel& model, int64_t first = 0) {
  const StoredTensor& keys = model.tensors.at("keys");
  const StoredTensor& values = model.tensors.at("values");
  if (keys.shape != attn::Shape{keys.shape[0], kD} ||
      values.shape != attn::Shape{keys.shape[0], kV}) {
    return -1;
  }
  // Each row's expected value, part by part (a grown memory may be held in
  // pieces).
  auto rows_hold = [first](const StoredTensor& tensor, int64_t width,
                           float sign) {
    int64_t i = 0;
    for (const StoredTensor& part : tensor.parts()) {
      if (part.in_pieces() || part.shape[0] < 0 || part.data == nullptr) {
        return part.shape[0] == 0;
      }
      for (int64_t row = 0; row < part.shape[0]; ++row, ++i) {
        for (int64_t j = 0; j < width; ++j) {
          if (part.data[row * width + j] != sign * static_cast<float>(first + i)) {
            return false;
          }
        }
      }
    }
    return i == tensor.shape[0];
  };
  if (!rows_hold(keys, kD, 1.0f) || !rows_hold(values, kV, -1.0f)) return -1;
  return keys.shape[0];
}

inline ModelRepository::Options OptionsFor(const std::string& dir,
                                    FileSystem* fs = nullptr) {
  ModelRepository::Options options;
  options.dir = dir;
  options.file_system = fs;
  options.remove_leftovers_after = absl::ZeroDuration();
  options.log = [](const std::string&) {};
  return options;
}

// Rows of memory m after a restart (0 without one, -1 if it fails to load
// or holds a wrong row), its first `first` rows evicted.
inline int64_t RowsAfterRestart(const std::string& dir, int64_t first = 0) {
  absl::StatusOr<std::unique_ptr<ModelRepository>> repository =
      LoadModelRepository(OptionsFor(dir));
  EXPECT_TRUE(repository.ok()) << repository.status();
  if (!repository.ok()) return -1;
  auto model = (*repository)->Find("m");
  return model == nullptr ? 0 : CheckedRows(*model, first);
}

inline absl::StatusOr<ModelRepository::Appended> Append(
    ModelCatalogue& catalogue, int64_t first, int64_t n, bool create = true,
    const std::string& name = "m") {
  const Rows rows = MakeRows(first, n);
  return catalogue.Append(/*may_append=*/true, name, rows.key_view(),
                          rows.value_view(),
                          create ? std::optional<MemorySettings>(MemorySettings{})
                                 : std::nullopt);
}

// A memory of 3 rows in `dir`, served through `fs`.
inline std::unique_ptr<ModelRepository> Seeded(const std::string& dir,
                                        FileSystem* fs) {
  {
    auto seeding = LoadModelRepository(OptionsFor(dir)).value();
    ModelCatalogue catalogue(seeding.get());
    EXPECT_TRUE(Append(catalogue, 0, 3).ok());
  }
  return LoadModelRepository(OptionsFor(dir, fs)).value();
}

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_MODELS_TEST_ROWS_H_

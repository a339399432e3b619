// GrowingTensor: appends past every view made, on disk (a scratch file,
// mapped), in a reserved range of memory and in the fallback buffer alike;
// a view keeps its rows, unchanged, however the tensor grows after, and its
// memory after the tensor is gone. On disk the rows are file pages, not the
// process's memory; a full disk fails an append and changes nothing.
#include "server/repository/growing_tensor.h"

#include <cerrno>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attn/tensor.h"
#include "gtest/gtest.h"
#include "server/repository/fault_injection_file_system.h"
#include "server/repository/test_folders.h"

namespace attnserve {
namespace {

// Rows [first, first + n) of width 3, row i all i.
attn::Tensor Rows(int64_t first, int64_t n) {
  attn::Tensor rows = attn::Tensor::Zeros({n, 3});
  for (int64_t i = 0; i < n * 3; ++i)
    rows.data[i] = static_cast<float>(first + i / 3);
  return rows;
}

bool HoldsRows(const StoredTensor& view, int64_t n) {
  if (view.shape != attn::Shape{n, 3}) return false;
  for (int64_t i = 0; i < n * 3; ++i) {
    if (view.data[i] != static_cast<float>(i / 3)) return false;
  }
  return true;
}

struct Placement {
  const char* label;
  int64_t max_bytes;
  bool on_disk;
};

TEST(GrowingTensorTest, ViewsKeepTheirRowsWhileItGrows) {
  // 1 MiB reserved, in memory and on disk; 1 KiB on disk (mapped anew
  // past it); and a limit no address space holds, which the fallback
  // buffer serves.
  const std::string dir = TempDir("attnserve-growing");
  const GrowingTensor::OnDisk on_disk{DefaultFileSystem(), dir};
  for (const Placement& placement :
       {Placement{"memory", int64_t{1} << 20, false},
        Placement{"disk", int64_t{1} << 20, true},
        Placement{"disk, mapped anew", 1024, true},
        Placement{"fallback buffer", std::numeric_limits<int64_t>::max() / 2,
                  false}}) {
    SCOPED_TRACE(placement.label);
    const int64_t max_bytes = placement.max_bytes;
    std::vector<std::pair<StoredTensor, int64_t>> views;
    int64_t rows = 5;
    absl::StatusOr<GrowingTensor> made = GrowingTensor::Create(
        StoredTensor(Rows(0, 5)), max_bytes,
        placement.on_disk ? &on_disk : nullptr);
    ASSERT_TRUE(made.ok()) << made.status();
    auto tensor = std::make_unique<GrowingTensor>(*std::move(made));
    EXPECT_EQ(tensor->on_disk(), placement.on_disk)
        << tensor->why_in_memory();
    EXPECT_EQ(tensor->reserved(),
              placement.on_disk || max_bytes == int64_t{1} << 20);
    EXPECT_EQ(InFilePages(tensor->View().data), placement.on_disk)
        << MappingOf(tensor->View().data);
    views.emplace_back(tensor->View(), rows);
    for (int64_t n : {1, 7, 30, 100, 3, 500, 2000}) {
      ASSERT_TRUE(tensor->Append(StoredTensor(Rows(rows, n))).ok());
      rows += n;
      views.emplace_back(tensor->View(), rows);
      for (const auto& [view, count] : views) {
        ASSERT_TRUE(HoldsRows(view, count)) << count << " of " << rows;
      }
    }
    EXPECT_EQ(tensor->rows(), rows);
    tensor.reset();  // the views own what they read
    for (const auto& [view, count] : views) EXPECT_TRUE(HoldsRows(view, count));
  }
}

TEST(GrowingTensorTest, BFloat16AndRankOneRows) {
  std::vector<uint16_t> bits = {1, 2, 3};
  auto owner = std::make_shared<std::vector<uint16_t>>(bits);
  const std::string dir = TempDir("attnserve-growing");
  const GrowingTensor::OnDisk on_disk{DefaultFileSystem(), dir};
  for (const GrowingTensor::OnDisk* where :
       {&on_disk, static_cast<const GrowingTensor::OnDisk*>(nullptr)}) {
    absl::StatusOr<GrowingTensor> tensor = GrowingTensor::Create(
        StoredTensor({3}, owner->data(), owner), 1 << 16, where);
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    const StoredTensor before = tensor->View();
    ASSERT_TRUE(tensor->Append(StoredTensor({3}, owner->data(), owner)).ok());
    const StoredTensor after = tensor->View();
    ASSERT_TRUE(after.is_bfloat16());
    EXPECT_EQ(after.shape, attn::Shape{6});
    EXPECT_EQ(before.shape, attn::Shape{3});
    for (int i = 0; i < 6; ++i) EXPECT_EQ(after.bfloat16[i], bits[i % 3]);
  }
}

// A full disk (or EIO) on a write fails the append with the file system's
// code and appends nothing: the rows and every view are as they were, and
// the next append goes on from there. A full disk at the start fails
// Create; a file system without scratch files, or a folder where one
// cannot be made, keeps the rows in memory, saying why.
TEST(GrowingTensorTest, AFailedWriteAppendsNothing) {
  const std::string dir = TempDir("attnserve-growing");
  FaultInjectionFileSystem fs(DefaultFileSystem());
  const GrowingTensor::OnDisk on_disk{&fs, dir};
  absl::StatusOr<GrowingTensor> tensor =
      GrowingTensor::Create(StoredTensor(Rows(0, 5)), 1 << 20, &on_disk);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  const StoredTensor before = tensor->View();
  for (const int error : {ENOSPC, EIO}) {
    fs.SetFault([error](const FaultInjectionFileSystem::Step& step) {
      return step.op == FaultInjectionFileSystem::Op::kWriteAt ? error : 0;
    });
    const absl::Status failed = tensor->Append(StoredTensor(Rows(5, 3)));
    EXPECT_EQ(failed.code(), error == ENOSPC
                                 ? absl::StatusCode::kResourceExhausted
                                 : absl::StatusCode::kInternal)
        << failed;
    EXPECT_EQ(tensor->rows(), 5);
    EXPECT_TRUE(HoldsRows(tensor->View(), 5));
  }
  fs.SetFault(nullptr);
  ASSERT_TRUE(tensor->Append(StoredTensor(Rows(5, 3))).ok());
  EXPECT_TRUE(HoldsRows(tensor->View(), 8));
  EXPECT_TRUE(HoldsRows(before, 5));

  fs.SetFault([](const FaultInjectionFileSystem::Step& step) {
    return step.op == FaultInjectionFileSystem::Op::kNewScratchFile ? ENOSPC
                                                                     : 0;
  });
  EXPECT_EQ(
      GrowingTensor::Create(StoredTensor(Rows(0, 5)), 1 << 20, &on_disk)
          .status()
          .code(),
      absl::StatusCode::kResourceExhausted);
  fs.SetFault([](const FaultInjectionFileSystem::Step& step) {
    return step.op == FaultInjectionFileSystem::Op::kNewScratchFile ? EROFS
                                                                     : 0;
  });
  absl::StatusOr<GrowingTensor> read_only =
      GrowingTensor::Create(StoredTensor(Rows(0, 5)), 1 << 20, &on_disk);
  ASSERT_TRUE(read_only.ok()) << read_only.status();
  EXPECT_FALSE(read_only->on_disk());
  EXPECT_NE(read_only->why_in_memory().find("no scratch file"),
            std::string::npos)
      << read_only->why_in_memory();
  EXPECT_TRUE(HoldsRows(read_only->View(), 5));
}

}  // namespace
}  // namespace attnserve

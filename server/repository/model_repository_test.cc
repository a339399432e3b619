// The model repository: safetensors round trips, the shipped example loads,
// and every malformed file is refused with a message naming it.
#include "server/repository/model_repository.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  char pattern[] = "/tmp/attnserve-repo-XXXXXX";
  return mkdtemp(pattern);
}

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(SafetensorsTest, RoundTrip) {
  std::map<std::string, attn::Tensor> tensors;
  tensors["a"] = attn::Tensor::Zeros({2, 3});
  for (int i = 0; i < 6; ++i) tensors["a"].data[i] = 0.5f * i;
  tensors["b"] = attn::Tensor::Zeros({1});
  tensors["b"].data[0] = -7.25f;
  absl::StatusOr<std::map<std::string, attn::Tensor>> parsed =
      ParseSafetensors(SerializeSafetensors(tensors));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ(parsed->at("a").shape, (attn::Shape{2, 3}));
  EXPECT_EQ(parsed->at("a").data[5], 2.5f);
  EXPECT_EQ(parsed->at("b").data[0], -7.25f);
}

TEST(SafetensorsTest, MalformedFilesAreRefused) {
  EXPECT_THAT(std::string(ParseSafetensors("abc").status().message()),
              HasSubstr("shorter than its header"));
  std::string huge(8, '\xff');
  EXPECT_THAT(std::string(ParseSafetensors(huge + "{}").status().message()),
              HasSubstr("runs past the file"));
  auto with_header = [](const std::string& json, const std::string& data) {
    std::string bytes(8, '\0');
    const uint64_t size = json.size();
    std::memcpy(bytes.data(), &size, 8);
    return bytes + json + data;
  };
  EXPECT_THAT(std::string(ParseSafetensors(with_header("{nope", "")).status().message()),
              HasSubstr("not JSON"));
  EXPECT_THAT(
      std::string(ParseSafetensors(
                      with_header(R"({"x":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})",
                                  "ab"))
                      .status()
                      .message()),
      HasSubstr("only F32"));
  EXPECT_THAT(
      std::string(ParseSafetensors(
                      with_header(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})",
                                  std::string(8, '\0')))
                      .status()
                      .message()),
      HasSubstr("do not hold 4 float32 values"));
  // JSON numbers that are not whole counts are refused, not cast (found by
  // fuzz/safetensors: 1e30 overflowed int64, 20.5 was read as 20, offsets
  // [0.5, 4.5] read the data from byte 0).
  const std::string eight(8, '\0');
  for (const char* header : {
           R"({"x":{"dtype":"F32","shape":[1e30],"data_offsets":[0,4]}})",
           R"({"x":{"dtype":"F32","shape":[-9.3e18],"data_offsets":[0,4]}})",
           R"({"x":{"dtype":"F32","shape":[1.9],"data_offsets":[0,4]}})",
           R"({"x":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})",
           R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0.5,4.5]}})",
           R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})",
       }) {
    const absl::Status status =
        ParseSafetensors(with_header(header, eight)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << header;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("must hold whole numbers")) << header;
  }
  // The same file with whole numbers is read.
  EXPECT_TRUE(
      ParseSafetensors(
          with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                      eight))
          .ok());
}

TEST(ModelRepositoryTest, LoadsTheShippedExample) {
  absl::StatusOr<std::unique_ptr<ModelRepository>> repository =
      ModelRepository::Load(std::string(ATTN_SOURCE_DIR) + "/deploy/models");
  ASSERT_TRUE(repository.ok()) << repository.status();
  EXPECT_THAT((*repository)->Names(),
              ::testing::ElementsAre("additive_attention", "nadaraya_watson_fitted"));
  auto additive = (*repository)->Find("additive_attention");
  ASSERT_NE(additive, nullptr);
  EXPECT_EQ(additive->tensors.at("W_q").shape, (attn::Shape{8, 20}));
  EXPECT_EQ((*repository)->Find("missing"), nullptr);
}

TEST(ModelRepositoryTest, BadModelsNameTheirFile) {
  const std::string dir = TempDir();
  mkdir((dir + "/m").c_str(), 0755);
  Write(dir + "/m/config.pbtxt", "name: \"m\" backend: \"additive_attention\"");
  auto missing = ModelRepository::Load(dir);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("m/weights.safetensors: cannot open"));

  std::map<std::string, attn::Tensor> tensors;
  tensors["W_q"] = attn::Tensor::Zeros({8, 3});
  tensors["W_k"] = attn::Tensor::Zeros({7, 2});  // h differs
  tensors["w_v"] = attn::Tensor::Zeros({8});
  Write(dir + "/m/weights.safetensors", SerializeSafetensors(tensors));
  EXPECT_THAT(std::string(ModelRepository::Load(dir).status().message()),
              HasSubstr("must share their first dimension h"));

  Write(dir + "/m/config.pbtxt", "name: \"other\" backend: \"additive_attention\"");
  EXPECT_THAT(std::string(ModelRepository::Load(dir).status().message()),
              HasSubstr("differs from its folder's name"));
  Write(dir + "/m/config.pbtxt", "this is not a config");
  EXPECT_THAT(std::string(ModelRepository::Load(dir).status().message()),
              HasSubstr("m/config.pbtxt: not an inference.ModelConfig"));
  EXPECT_EQ(ModelRepository::Load(dir + "/absent").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ModelRepositoryTest, SavedBandwidthIsServedAndReloads) {
  const std::string dir = TempDir();
  auto repository = ModelRepository::Load(dir).value();
  ASSERT_TRUE(repository->SaveBandwidth("fitted-1", 3.5f).ok());
  ASSERT_NE(repository->Find("fitted-1"), nullptr);
  EXPECT_EQ(repository->Find("fitted-1")->tensors.at("bandwidth").data[0], 3.5f);
  EXPECT_EQ(repository->SaveBandwidth("../escape", 1.0f).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(repository->SaveBandwidth("bad", -1.0f).code(),
            absl::StatusCode::kInvalidArgument);
  auto reloaded = ModelRepository::Load(dir).value();
  ASSERT_NE(reloaded->Find("fitted-1"), nullptr);
  EXPECT_EQ(reloaded->Find("fitted-1")->config.backend(), "nadaraya_watson");

  auto none = ModelRepository::Load("").value();
  EXPECT_EQ(none->SaveBandwidth("x", 1.0f).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Writes an additive_attention model `name` with h = 4 and W_q filled
// with `value`.
void WriteAdditive(const std::string& dir, const std::string& name,
                   float value) {
  mkdir((dir + "/" + name).c_str(), 0755);
  Write(dir + "/" + name + "/config.pbtxt",
        "name: \"" + name + "\" backend: \"additive_attention\"");
  std::map<std::string, attn::Tensor> tensors;
  tensors["W_q"] = attn::Tensor::Zeros({4, 3});
  for (float& x : tensors["W_q"].data) x = value;
  tensors["W_k"] = attn::Tensor::Zeros({4, 2});
  tensors["w_v"] = attn::Tensor::Zeros({4});
  Write(dir + "/" + name + "/weights.safetensors",
        SerializeSafetensors(tensors));
}

std::map<std::string, std::string> States(const ModelRepository& repository) {
  std::map<std::string, std::string> states;
  for (const auto& model : repository.Index()) {
    states[model.name] = model.state + (model.reason.empty() ? "" : ": ") +
                         model.reason;
  }
  return states;
}

TEST(ModelRepositoryTest, LoadUnloadAndReloadWhileServing) {
  const std::string dir = TempDir();
  WriteAdditive(dir, "a", 1.0f);
  auto repository = ModelRepository::Load(dir).value();
  EXPECT_EQ(States(*repository),
            (std::map<std::string, std::string>{{"a", "READY"}}));

  // A folder added while serving is listed, and served once loaded.
  WriteAdditive(dir, "b", 2.0f);
  EXPECT_EQ(States(*repository)["b"], "UNAVAILABLE: not loaded");
  EXPECT_EQ(repository->Find("b"), nullptr);
  ASSERT_TRUE(repository->LoadModel("b").ok());
  EXPECT_EQ(States(*repository)["b"], "READY");
  EXPECT_EQ(repository->Find("b")->tensors.at("W_q").data[0], 2.0f);

  // Unloaded while a call holds it: the holder keeps its weights, the
  // index says UNLOADING until it lets go, new lookups find nothing.
  std::shared_ptr<const RepositoryModel> in_flight = repository->Find("a");
  ASSERT_TRUE(repository->UnloadModel("a").ok());
  EXPECT_EQ(repository->Find("a"), nullptr);
  EXPECT_EQ(in_flight->tensors.at("W_q").data[0], 1.0f);
  EXPECT_THAT(States(*repository)["a"], HasSubstr("UNLOADING"));
  in_flight.reset();
  EXPECT_EQ(States(*repository)["a"], "UNAVAILABLE: unloaded");
  EXPECT_EQ(repository->UnloadModel("a").code(), absl::StatusCode::kNotFound);

  // Reload picks up changed weights; the old version stays with its holder.
  std::shared_ptr<const RepositoryModel> old_b = repository->Find("b");
  WriteAdditive(dir, "b", 3.0f);
  ASSERT_TRUE(repository->LoadModel("b").ok());
  EXPECT_EQ(repository->Find("b")->tensors.at("W_q").data[0], 3.0f);
  EXPECT_EQ(old_b->tensors.at("W_q").data[0], 2.0f);

  // A broken folder fails to load with its file named; what served stays.
  Write(dir + "/b/weights.safetensors", "garbage");
  const absl::Status broken = repository->LoadModel("b");
  EXPECT_EQ(broken.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(broken.message()), HasSubstr("b/weights.safetensors"));
  EXPECT_EQ(repository->Find("b")->tensors.at("W_q").data[0], 3.0f);
  EXPECT_EQ(States(*repository)["b"], "READY");
  // Unloaded, it shows why it could not come back.
  ASSERT_TRUE(repository->UnloadModel("b").ok());
  EXPECT_FALSE(repository->LoadModel("b").ok());
  EXPECT_THAT(States(*repository)["b"], HasSubstr("failed to load"));

  // Names are checked before any path is built.
  EXPECT_EQ(repository->LoadModel("../etc").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(repository->LoadModel("absent").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ModelRepository::Load("").value()->LoadModel("a").code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace attnserve

// The KServe REST codec (server/kserve/rest.h) alone, at the medium
// case of bench/perf_analyzer.sh: scaled dot-product attention with
// queries, keys and values of [1,64,64] (12,289 numbers in), both outputs
// [1,64,64] back (8,192 numbers out). The request text is what
// perf_analyzer 2.60 sends with --input-tensor-format=json: each float
// widened to double and written in double's shortest form, 17 significant
// digits for most. Shows where a JSON inference's server CPU goes beside
// the binary tensor extension's, and the floor under it: the standard
// number conversions alone. Not part of the test suite:
//
//   build/bench/rest_codec_benchmark --benchmark_min_time=1
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"
#include "server/kserve/rest.h"

namespace attnserve {
namespace {

constexpr int kSide = 64;
constexpr int kElements = kSide * kSide;

// perf_analyzer's data: N(0,1) rounded to 4 decimals, as float.
std::vector<float> Values(int count, unsigned seed) {
  std::mt19937 random(seed);
  std::normal_distribution<double> normal;
  std::vector<float> values(count);
  for (float& value : values) {
    value = static_cast<float>(std::round(normal(random) * 1e4) / 1e4);
  }
  return values;
}

void AppendDoubleText(float value, std::string* out) {
  char buffer[32];
  auto [end, error] =
      std::to_chars(buffer, buffer + sizeof buffer, static_cast<double>(value));
  out->append(buffer, end);
}

std::string JsonInput(const char* name, const std::vector<float>& values) {
  std::string text = std::string("{\"name\":\"") + name +
                     "\",\"datatype\":\"FP32\",\"shape\":[1,64,64],\"data\":[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) text.push_back(',');
    AppendDoubleText(values[i], &text);
  }
  return text + "]}";
}

std::string MediumJsonBody() {
  return "{\"id\":\"\",\"inputs\":[" + JsonInput("queries", Values(kElements, 1)) +
         "," + JsonInput("keys", Values(kElements, 2)) + "," +
         JsonInput("values", Values(kElements, 3)) +
         ",{\"name\":\"valid_lens\",\"datatype\":\"INT32\",\"shape\":[1,1],"
         "\"data\":[37]}],\"outputs\":[{\"name\":\"attention_weights\","
         "\"parameters\":{\"binary_data\":false}},{\"name\":\"output\","
         "\"parameters\":{\"binary_data\":false}}]}";
}

// The same request with the binary tensor extension: (body, header length).
std::pair<std::string, size_t> MediumBinaryBody() {
  std::string json = "{\"inputs\":[";
  std::string binary;
  const char* names[] = {"queries", "keys", "values"};
  for (int i = 0; i < 3; ++i) {
    json += std::string("{\"name\":\"") + names[i] +
            "\",\"datatype\":\"FP32\",\"shape\":[1,64,64],\"parameters\":"
            "{\"binary_data_size\":" + std::to_string(kElements * 4) + "}},";
    const std::vector<float> values = Values(kElements, i + 1);
    binary.append(reinterpret_cast<const char*>(values.data()),
                  values.size() * sizeof(float));
  }
  json += "{\"name\":\"valid_lens\",\"datatype\":\"INT32\",\"shape\":[1,1],"
          "\"parameters\":{\"binary_data_size\":4}}],\"outputs\":[{\"name\":"
          "\"attention_weights\",\"parameters\":{\"binary_data\":true}},"
          "{\"name\":\"output\",\"parameters\":{\"binary_data\":true}}]}";
  const int32_t valid_length = 37;
  binary.append(reinterpret_cast<const char*>(&valid_length), 4);
  return {json + binary, json.size()};
}

void BM_ParseMediumJson(benchmark::State& state) {
  const std::string body = MediumJsonBody();
  RestInferRequest request;
  for (auto _ : state) {
    const absl::Status status = ParseRestInferRequest(
        "dot_product_attention", "", body, std::nullopt, &request);
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
    benchmark::DoNotOptimize(request);
  }
  state.SetItemsProcessed(state.iterations() * (3 * kElements + 1));
  state.SetBytesProcessed(state.iterations() * body.size());
}
BENCHMARK(BM_ParseMediumJson);

void BM_ParseMediumBinary(benchmark::State& state) {
  const auto [body, json_length] = MediumBinaryBody();
  RestInferRequest request;
  for (auto _ : state) {
    const absl::Status status = ParseRestInferRequest(
        "dot_product_attention", "", body, json_length, &request);
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
    benchmark::DoNotOptimize(request);
  }
}
BENCHMARK(BM_ParseMediumBinary);

inference::ModelInferResponse MediumResponse() {
  inference::ModelInferResponse response;
  response.set_model_name("dot_product_attention");
  response.set_model_version("1");
  const char* names[] = {"attention_weights", "output"};
  for (int i = 0; i < 2; ++i) {
    auto* output = response.add_outputs();
    output->set_name(names[i]);
    output->set_datatype("FP32");
    for (int64_t d : {1, kSide, kSide}) output->add_shape(d);
    std::vector<float> values = Values(kElements, 10 + i);
    if (i == 0) {  // weights: in [0, 1]
      for (float& value : values) value = std::abs(value) / 4;
    }
    response.add_raw_output_contents(
        std::string(reinterpret_cast<const char*>(values.data()),
                    values.size() * sizeof(float)));
  }
  return response;
}

void BM_WriteMediumJson(benchmark::State& state) {
  const inference::ModelInferResponse response = MediumResponse();
  RestInferRequest request;  // binary_data_output false: JSON data
  RestBody body;
  for (auto _ : state) {
    WriteRestInferResponse(request, response, &body);
    benchmark::DoNotOptimize(body);
  }
  state.SetItemsProcessed(state.iterations() * 2 * kElements);
  state.SetBytesProcessed(state.iterations() * body.bytes.size());
}
BENCHMARK(BM_WriteMediumJson);

void BM_WriteMediumBinary(benchmark::State& state) {
  const inference::ModelInferResponse response = MediumResponse();
  RestInferRequest request;
  request.binary_data_output = true;
  RestBody body;
  for (auto _ : state) {
    WriteRestInferResponse(request, response, &body);
    benchmark::DoNotOptimize(body);
  }
}
BENCHMARK(BM_WriteMediumBinary);

// The floor under the two JSON rows above: the standard library's number
// conversions alone over the same numbers (the 12,288 floats of the
// request's three tensors as perf_analyzer writes them, the 8,192 of the
// response), with no JSON, no validation and no copies around them.
void BM_FromCharsOnlyMediumRequest(benchmark::State& state) {
  std::string text;
  for (unsigned seed = 1; seed <= 3; ++seed) {
    for (float value : Values(kElements, seed)) {
      AppendDoubleText(value, &text);
      text.push_back(',');
    }
  }
  const char* const end = text.data() + text.size();
  for (auto _ : state) {
    float sum = 0;
    for (const char* p = text.data(); p < end;) {
      float value;
      p = std::from_chars(p, end, value).ptr + 1;  // and the ','
      sum += value;
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * 3 * kElements);
}
BENCHMARK(BM_FromCharsOnlyMediumRequest);

void BM_ToCharsOnlyMediumResponse(benchmark::State& state) {
  std::vector<float> values = Values(kElements, 10);
  for (float& value : values) value = std::abs(value) / 4;
  const std::vector<float> output = Values(kElements, 11);
  values.insert(values.end(), output.begin(), output.end());
  std::string text(values.size() * 16, '\0');
  for (auto _ : state) {
    char* p = text.data();
    for (float value : values) {
      p = std::to_chars(p, text.data() + text.size(), value).ptr;
    }
    benchmark::DoNotOptimize(p);
  }
  state.SetItemsProcessed(state.iterations() * values.size());
}
BENCHMARK(BM_ToCharsOnlyMediumResponse);

}  // namespace
}  // namespace attnserve

BENCHMARK_MAIN();

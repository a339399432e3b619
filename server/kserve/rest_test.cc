// Unit tests of the KServe v2 REST codec (server/kserve/rest.h): each
// promise of the header, checked from outside. Numbers are checked against
// what the contract says (the nearest float, a shortest form that reads back
// bit-exactly, a refusal naming the input), never against one library's or
// CPU's digits.
#include "server/kserve/rest.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_service.pb.h"
#include "inference/model_config.pb.h"
#include "rapidjson/document.h"
#include "rapidjson/error/en.h"

namespace attnserve {
namespace {

using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// --- Helpers ----------------------------------------------------------------

absl::Status Parse(const std::string& body, RestInferRequest* out,
                   std::optional<uint64_t> json_length = std::nullopt) {
  return ParseRestInferRequest("model", "", body, json_length, out);
}

// A request body with one input, `name`, of `datatype` and `shape` (JSON
// text, e.g. "[2,3]") with `data` (JSON text).
std::string OneInput(const std::string& name, const std::string& datatype,
                     const std::string& shape, const std::string& data) {
  return absl::StrCat(R"({"inputs":[{"name":")", name, R"(","datatype":")",
                      datatype, R"(","shape":)", shape, R"(,"data":)", data,
                      "}]}");
}

template <typename T>
std::vector<T> RawAs(const std::string& raw) {
  EXPECT_EQ(raw.size() % sizeof(T), 0u) << raw.size();
  std::vector<T> values(raw.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), raw.data(), raw.size());
  return values;
}

uint32_t BitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
uint64_t BitsOf(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

std::string ToChars(float value) {
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  EXPECT_EQ(error, std::errc());
  return std::string(buffer, end);
}
std::string ToChars(double value) {
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  EXPECT_EQ(error, std::errc());
  return std::string(buffer, end);
}

// Parses `body` and returns input 0's raw contents (empty on failure, with a
// test failure).
std::string RawOf(const std::string& body) {
  RestInferRequest out;
  const absl::Status status = Parse(body, &out);
  EXPECT_TRUE(status.ok()) << status << "\nbody: " << body;
  if (!status.ok()) return {};
  EXPECT_EQ(out.request.raw_input_contents_size(), out.request.inputs_size());
  if (out.request.raw_input_contents_size() < 1) return {};
  return out.request.raw_input_contents(0);
}

// The status of a request expected to fail: INVALID_ARGUMENT whose message
// holds every one of `parts`.
void ExpectInvalid(const std::string& body,
                   std::initializer_list<std::string> parts,
                   std::optional<uint64_t> json_length = std::nullopt) {
  RestInferRequest out;
  const absl::Status status = Parse(body, &out, json_length);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
      << status << "\nbody: " << body;
  EXPECT_FALSE(status.message().empty());
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(status.message()), HasSubstr(part))
        << "body: " << body;
  }
}

// A JSON document, parsed strictly (numbers kept as their text).
rapidjson::Document ParseDocument(absl::string_view text) {
  rapidjson::Document document;
  document.Parse<rapidjson::kParseNumbersAsStringsFlag |
                 rapidjson::kParseValidateEncodingFlag>(text.data(),
                                                        text.size());
  EXPECT_FALSE(document.HasParseError())
      << rapidjson::GetParseError_En(document.GetParseError()) << " at "
      << document.GetErrorOffset() << " in: " << text;
  return document;
}

std::string Text(const rapidjson::Value& value) {
  return std::string(value.GetString(), value.GetStringLength());
}

// --- JSON data ----------------------------------------------------------------

TEST(ParseRestInferRequest, FlatFp32Data) {
  RestInferRequest out;
  const absl::Status status = ParseRestInferRequest(
      "attention", "3",
      R"({"id":"req-1","inputs":[{"name":"queries","shape":[2,3],)"
      R"("datatype":"FP32","data":[1,2.5,-3,0.25,1e3,-0]}]})",
      std::nullopt, &out);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(out.request.model_name(), "attention");
  EXPECT_EQ(out.request.model_version(), "3");
  EXPECT_EQ(out.request.id(), "req-1");
  ASSERT_EQ(out.request.inputs_size(), 1);
  const auto& input = out.request.inputs(0);
  EXPECT_EQ(input.name(), "queries");
  EXPECT_EQ(input.datatype(), "FP32");
  EXPECT_THAT(input.shape(), ElementsAre(2, 3));
  EXPECT_FALSE(input.has_contents());
  ASSERT_EQ(out.request.raw_input_contents_size(), 1);
  const std::vector<float> values =
      RawAs<float>(out.request.raw_input_contents(0));
  EXPECT_THAT(values, ElementsAre(1.0f, 2.5f, -3.0f, 0.25f, 1000.0f, 0.0f));
  EXPECT_TRUE(std::signbit(values[5])) << "-0 keeps its sign";
  EXPECT_FALSE(out.binary_data_output);
  EXPECT_TRUE(out.output_binary.empty());
}

TEST(ParseRestInferRequest, NestedDataIsRowMajorLikeFlat) {
  const std::string flat = RawOf(OneInput("x", "FP32", "[2,3]", "[1,2,3,4,5,6]"));
  EXPECT_EQ(RawOf(OneInput("x", "FP32", "[2,3]", "[[1,2,3],[4,5,6]]")), flat);
  EXPECT_EQ(RawOf(OneInput("x", "FP32", "[2,3]", "[[[1],[2],[3]],[[4],[5],[6]]]")),
            flat);
  EXPECT_THAT(RawAs<float>(flat), ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_THAT(RawAs<int32_t>(RawOf(OneInput("x", "INT32", "[2,2,1]",
                                            "[[[1],[2]],[[3],[4]]]"))),
              ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(RawAs<uint8_t>(RawOf(
                  OneInput("x", "BOOL", "[2,2]", "[[true,false],[false,true]]"))),
              ElementsAre(1, 0, 0, 1));
}

TEST(ParseRestInferRequest, DataBeforeDatatype) {
  EXPECT_THAT(
      RawAs<int32_t>(RawOf(
          R"({"inputs":[{"data":[[1,-2],[3,4]],"name":"x","shape":[2,2],)"
          R"("datatype":"INT32"}]})")),
      ElementsAre(1, -2, 3, 4));
  EXPECT_THAT(RawAs<float>(RawOf(
                  R"({"inputs":[{"name":"x","data":[0.5,1e-45],"shape":[2],)"
                  R"("datatype":"FP32"}]})")),
              ElementsAre(0.5f, std::numeric_limits<float>::denorm_min()));
  EXPECT_THAT(RawAs<uint8_t>(RawOf(
                  R"({"inputs":[{"name":"b","data":[true,false,true],)"
                  R"("datatype":"BOOL","shape":[3]}]})")),
              ElementsAre(1, 0, 1));
  EXPECT_THAT(RawAs<uint16_t>(RawOf(
                  R"({"inputs":[{"shape":[1],"data":[65535],"name":"u",)"
                  R"("datatype":"UINT16"}]})")),
              ElementsAre(65535));
  // Converted with the datatype that comes after it: range errors too.
  ExpectInvalid(R"({"inputs":[{"name":"x","data":[1,300],"shape":[2],)"
                R"("datatype":"INT8"}]})",
                {"input 'x'", "8-bit"});
  ExpectInvalid(R"({"inputs":[{"name":"x","data":[1,true],"shape":[2],)"
                R"("datatype":"INT32"}]})",
                {"input 'x'"});
  ExpectInvalid(R"({"inputs":[{"name":"x","data":[1,2],"shape":[2],)"
                R"("datatype":"BOOL"}]})",
                {"input 'x'", "true or false"});
}

TEST(ParseRestInferRequest, EmptyDataBeforeDatatype) {
  // An empty tensor: `data` [] and then its datatype, as [] after it is.
  EXPECT_EQ(RawOf(OneInput("x", "FP32", "[0]", "[]")), "");
  RestInferRequest out;
  const absl::Status status = Parse(
      R"({"inputs":[{"name":"x","shape":[0],"data":[],"datatype":"FP32"}]})",
      &out);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(out.request.raw_input_contents_size(), 1);
  EXPECT_EQ(out.request.raw_input_contents(0), "");
}

TEST(ParseRestInferRequest, SeveralJsonInputsInOrder) {
  RestInferRequest out;
  const absl::Status status = Parse(
      R"({"inputs":[)"
      R"({"name":"a","datatype":"FP32","shape":[2],"data":[1,2]},)"
      R"({"name":"b","datatype":"INT64","shape":[1],"data":[-7]},)"
      R"({"name":"c","datatype":"BOOL","shape":[1],"data":[true]}],)"
      R"("outputs":[{"name":"y"}]})",
      &out);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(out.request.inputs_size(), 3);
  ASSERT_EQ(out.request.raw_input_contents_size(), 3);
  EXPECT_EQ(out.request.inputs(1).name(), "b");
  EXPECT_THAT(RawAs<float>(out.request.raw_input_contents(0)), ElementsAre(1, 2));
  EXPECT_THAT(RawAs<int64_t>(out.request.raw_input_contents(1)), ElementsAre(-7));
  EXPECT_THAT(RawAs<uint8_t>(out.request.raw_input_contents(2)), ElementsAre(1));
  ASSERT_EQ(out.request.outputs_size(), 1);
  EXPECT_EQ(out.request.outputs(0).name(), "y");
}

// --- Datatypes ------------------------------------------------------------------

TEST(ParseRestInferRequest, SignedIntegersAtTheirLimits) {
  EXPECT_THAT(RawAs<int8_t>(RawOf(OneInput("x", "INT8", "[4]", "[-128,127,0,-0]"))),
              ElementsAre(-128, 127, 0, 0));
  EXPECT_THAT(
      RawAs<int16_t>(RawOf(OneInput("x", "INT16", "[3]", "[-32768,32767,-1]"))),
      ElementsAre(-32768, 32767, -1));
  EXPECT_THAT(RawAs<int32_t>(RawOf(
                  OneInput("x", "INT32", "[3]", "[-2147483648,2147483647,5]"))),
              ElementsAre(std::numeric_limits<int32_t>::min(),
                          std::numeric_limits<int32_t>::max(), 5));
  EXPECT_THAT(RawAs<int64_t>(RawOf(OneInput(
                  "x", "INT64", "[3]",
                  "[-9223372036854775808,9223372036854775807,9007199254740993]"))),
              ElementsAre(std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max(),
                          int64_t{9007199254740993}));
}

TEST(ParseRestInferRequest, UnsignedIntegersAtTheirLimits) {
  EXPECT_THAT(RawAs<uint8_t>(RawOf(OneInput("x", "UINT8", "[2]", "[0,255]"))),
              ElementsAre(0, 255));
  EXPECT_THAT(RawAs<uint16_t>(RawOf(OneInput("x", "UINT16", "[2]", "[0,65535]"))),
              ElementsAre(0, 65535));
  EXPECT_THAT(
      RawAs<uint32_t>(RawOf(OneInput("x", "UINT32", "[2]", "[0,4294967295]"))),
      ElementsAre(0u, 4294967295u));
  EXPECT_THAT(RawAs<uint64_t>(RawOf(OneInput(
                  "x", "UINT64", "[2]", "[0,18446744073709551615]"))),
              ElementsAre(0u, std::numeric_limits<uint64_t>::max()));
}

TEST(ParseRestInferRequest, IntegersOutOfRangeOrNotIntegersAreRefused) {
  struct Case {
    const char* datatype;
    const char* value;
  };
  const Case cases[] = {
      {"INT8", "128"}, {"INT8", "-129"}, {"INT8", "1000"},
      {"INT16", "32768"}, {"INT16", "-32769"},
      {"INT32", "2147483648"}, {"INT32", "-2147483649"},
      {"INT64", "9223372036854775808"}, {"INT64", "-9223372036854775809"},
      {"INT64", "100000000000000000000000"},
      {"UINT8", "256"}, {"UINT8", "-1"},
      {"UINT16", "65536"}, {"UINT16", "-1"},
      {"UINT32", "4294967296"}, {"UINT32", "-5"},
      {"UINT64", "18446744073709551616"}, {"UINT64", "-1"},
      // Not integers, whatever their value.
      {"INT32", "1.5"}, {"INT32", "1.0"}, {"INT32", "1e2"}, {"INT64", "0.0"},
      {"UINT8", "2.5"}, {"UINT64", "1E1"}, {"INT8", "true"}, {"UINT16", "false"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.datatype, " ", c.value));
    // The bad element is the second: the message names the input and the
    // element's place.
    ExpectInvalid(OneInput("tensor_x", c.datatype, "[3]",
                           absl::StrCat("[1,", c.value, ",2]")),
                  {"input 'tensor_x'", "element 1", c.datatype});
  }
}

TEST(ParseRestInferRequest, RangeErrorsSayTheRange) {
  ExpectInvalid(OneInput("x", "INT16", "[1]", "[40000]"), {"16-bit signed"});
  ExpectInvalid(OneInput("x", "UINT32", "[1]", "[-1]"), {"32-bit unsigned"});
}

TEST(ParseRestInferRequest, Fp32IsTheNearestFloat) {
  // The compiler's literals are correctly rounded: the nearest float to the
  // decimal, which is what the contract asks of the decoder.
  EXPECT_THAT(RawAs<float>(RawOf(OneInput(
                  "x", "FP32", "[6]",
                  "[0.1,3.14159265358979,-2.718281828459045,1e-7,"
                  "123456789,16777217.5]"))),
              ElementsAre(0.1f, 3.14159265358979f, -2.718281828459045f, 1e-7f,
                          123456789.0f, 16777217.5f));
  // The extremes of float, written with more digits than needed.
  const std::vector<float> extremes = RawAs<float>(RawOf(OneInput(
      "x", "FP32", "[5]",
      "[3.4028234663852886e38,-3.4028234663852886e38,"
      "1.1754943508222875e-38,1.401298464324817e-45,1e-45]")));
  EXPECT_THAT(extremes,
              ElementsAre(std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::denorm_min()));
}

TEST(ParseRestInferRequest, Fp32BelowTheLeastSubnormalIsZero) {
  // 1e-50 and 1e-400 are nearer 0 than any other float (1e-400 is beyond
  // double's range too).
  const std::vector<float> values = RawAs<float>(RawOf(OneInput(
      "x", "FP32", "[4]", "[1e-50,-1e-50,1e-400,7e-46]")));
  ASSERT_EQ(values.size(), 4u);
  for (float value : values) EXPECT_EQ(value, 0.0f);
  EXPECT_TRUE(std::signbit(values[1])) << "-1e-50's nearest float is -0";
}

// A value beyond the datatype's range: refused naming the input, or (the
// decoder downstream refuses non-finite inputs) the infinity of its sign;
// never a finite value. RapidJSON itself refuses numbers whose decimal
// exponent is beyond double's (1e309, 1e400) as "not valid JSON", before
// the codec sees them: those need only be refused.
void ExpectRefusedOrInfinite(const std::string& datatype,
                             const std::string& text, bool negative,
                             bool json_may_refuse = false) {
  SCOPED_TRACE(datatype + " " + text);
  RestInferRequest out;
  const absl::Status status =
      Parse(OneInput("big", datatype, "[1]", "[" + text + "]"), &out);
  if (!status.ok()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    if (!json_may_refuse) {
      EXPECT_THAT(std::string(status.message()), HasSubstr("input 'big'"));
    }
    return;
  }
  ASSERT_EQ(out.request.raw_input_contents_size(), 1);
  const std::string& raw = out.request.raw_input_contents(0);
  const double value = datatype == "FP32" ? RawAs<float>(raw).at(0)
                                          : RawAs<double>(raw).at(0);
  EXPECT_TRUE(std::isinf(value)) << text << " became " << value;
  EXPECT_EQ(std::signbit(value), negative) << text << " became " << value;
}

TEST(ParseRestInferRequest, Fp32BeyondFloatRangeIsNeverFinite) {
  ExpectRefusedOrInfinite("FP32", "1e39", false);
  ExpectRefusedOrInfinite("FP32", "-1e39", true);
  ExpectRefusedOrInfinite("FP32", "3.4028236e38", false);
  ExpectRefusedOrInfinite("FP32", "1e308", false);
}

TEST(ParseRestInferRequest, Fp32BeyondDoubleRangeIsNeverFinite) {
  // Beyond double's range as well, yet JSON numbers RapidJSON lets through
  // (exponent <= 308): must not come out as 0.
  ExpectRefusedOrInfinite("FP32", "1.8e308", false);
  ExpectRefusedOrInfinite("FP32", "-1.8e308", true);
  ExpectRefusedOrInfinite("FP32", "17976931348623159e292", false);
  ExpectRefusedOrInfinite("FP32", "1e400", false, /*json_may_refuse=*/true);
  ExpectRefusedOrInfinite("FP32", "-1e400", true, /*json_may_refuse=*/true);
}

TEST(ParseRestInferRequest, Fp32RoundTripsEveryShortestForm) {
  // Random float32 bit patterns (every finite one: normal, subnormal, +-0),
  // written with std::to_chars (shortest), read back bit-exactly.
  std::mt19937 random(20240611);
  std::vector<float> expected = {0.0f,
                                 -0.0f,
                                 std::numeric_limits<float>::denorm_min(),
                                 -std::numeric_limits<float>::denorm_min(),
                                 std::numeric_limits<float>::min(),
                                 std::nextafter(std::numeric_limits<float>::min(), 0.0f),
                                 std::numeric_limits<float>::max(),
                                 std::numeric_limits<float>::lowest(),
                                 0.1f,
                                 1.0f / 3.0f,
                                 16777216.0f,
                                 16777218.0f};
  while (expected.size() < 60000) {
    const uint32_t bits = random();
    float value;
    std::memcpy(&value, &bits, sizeof value);
    if (std::isfinite(value)) expected.push_back(value);
  }
  std::string data = "[";
  for (size_t i = 0; i < expected.size(); ++i) {
    if (i > 0) data += ',';
    data += ToChars(expected[i]);
  }
  data += "]";
  const std::vector<float> got = RawAs<float>(RawOf(
      OneInput("x", "FP32", absl::StrCat("[", expected.size(), "]"), data)));
  ASSERT_EQ(got.size(), expected.size());
  int mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (BitsOf(got[i]) != BitsOf(expected[i]) && ++mismatches <= 10) {
      ADD_FAILURE() << ToChars(expected[i]) << " read back as " << ToChars(got[i]);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// A data array whose datatype came first is read by the codec's own number
// scanner (the data fast path), one whose datatype comes after it by
// RapidJSON number by number (kept as text until the datatype is known):
// the same text must give the same bytes, and the same errors, either way.
// Numbers that may lie beyond double's range (1e400), which RapidJSON
// refuses, are left to it by the fast path (the REST fuzzer's oracle found
// the fast path accepting them), so both refuse those alike.
std::string DataFirst(const std::string& datatype, const std::string& shape,
                      const std::string& data) {
  return absl::StrCat(R"({"inputs":[{"name":"x","data":)", data,
                      R"(,"shape":)", shape, R"(,"datatype":")", datatype,
                      "\"}]}");
}

TEST(ParseRestInferRequest, DataFastPathReadsWhatRapidJsonReads) {
  std::mt19937 random(20261124);
  std::normal_distribution<double> normal;
  std::vector<std::string> numbers = {
      "0",      "-0",      "0.0",     "-0.0",   "1",       "-1",
      "1e5",    "1E5",     "1e+5",    "1e-5",   "-1.5e-3", "123456789012",
      "1e-46",  "-1e-46",  "1e39",    "-1e39",  "1e308",   "1e-400",
      "0.1",    "16777217", "3.4028235e38", "3.4028236e38",
      "1.17549435e-38", "1.4e-45", "0.30000000000000004",
      "1.00000000000000000000000000000000000000000000001"};
  for (int i = 0; i < 3000; ++i) {
    const float value = static_cast<float>(normal(random) *
                                           std::pow(10.0, static_cast<int>(random() % 20) - 10));
    numbers.push_back(ToChars(value));
    char buffer[40];  // as perf_analyzer writes: the float widened to double
    numbers.emplace_back(
        buffer, std::to_chars(buffer, buffer + sizeof buffer,
                              static_cast<double>(value)).ptr);
  }
  const std::string shape = absl::StrCat("[", numbers.size(), "]");
  // Separators as clients write them: none, spaces, newlines.
  for (const char* separator : {",", ", ", " ,\n\t"}) {
    const std::string data =
        absl::StrCat("[ ", absl::StrJoin(numbers, separator), " ]");
    for (const char* datatype : {"FP32", "FP64"}) {
      SCOPED_TRACE(absl::StrCat(datatype, " separated by '", separator, "'"));
      const std::string fast = RawOf(OneInput("x", datatype, shape, data));
      EXPECT_EQ(fast.size(), numbers.size() * (datatype[2] == '3' ? 4 : 8));
      EXPECT_TRUE(fast == RawOf(DataFirst(datatype, shape, data)));
    }
  }
  for (const char* datatype : {"INT8", "INT32", "INT64", "UINT8", "UINT64"}) {
    SCOPED_TRACE(datatype);
    const std::string data = "[0, 1,-1, 127,-128 ,255,65535, 9223372036854775807]";
    RestInferRequest fast, slow;
    const absl::Status fast_status = Parse(OneInput("x", datatype, "[8]", data), &fast);
    const absl::Status slow_status = Parse(DataFirst(datatype, "[8]", data), &slow);
    EXPECT_EQ(fast_status, slow_status);
    if (fast_status.ok()) {
      EXPECT_EQ(fast.request.raw_input_contents(0),
                slow.request.raw_input_contents(0));
    }
  }
}

TEST(ParseRestInferRequest, DataFastPathLeavesEveryFaultToTheParser) {
  // Each fault comes after numbers the fast path has read: the request is
  // refused all the same, as invalid JSON at the fault.
  // The second row is what std::from_chars reads and JSON does not (the
  // FP32 fast path converts with it before it checks the grammar).
  for (const char* data :
       {"[1,2,]", "[1,2 3]", "[1,,2]", "[1,2", "[1,2}", "[1,-]", "[1,2.]",
        "[1,2e]", "[1,2x]", "[1,02]", "[1,.5]", "[1,2]]", "[1,+2]",
        "[1,2,1e400]", "[1,2,3333.4028236e38333333333]",
        "[1,5.e3]", "[1,-.5]", "[1,-01]", "[1,00]", "[1,-0.]", "[1,1e+]",
        "[1,1.5e]", "[1,inf]", "[1,-inf]", "[1,infinity]", "[1,Infinity]",
        "[1,nan]", "[1,NaN]", "[1,0x1p3]", "[1,1p3]", "[1,1.5.5]"}) {
    for (const char* datatype : {"FP32", "FP64"}) {
      SCOPED_TRACE(absl::StrCat(datatype, " ", data));
      RestInferRequest out;
      const absl::Status status =
          Parse(OneInput("x", datatype, "[3]", data), &out);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      // Refused as JSON, not later for its element count (each has fewer).
      EXPECT_THAT(status.message(), HasSubstr("is not valid JSON")) << status;
    }
  }
  ExpectInvalid(OneInput("x", "FP32", "[3]", "[1,2,\"3\"]"),
                {"input 'x'", "data element 2 is a string"});
  // Layouts it hands back to RapidJSON part way still read in full.
  EXPECT_THAT(RawAs<float>(RawOf(OneInput("x", "FP32", "[4]", "[1,[2,3],4]"))),
              ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(RawAs<float>(RawOf(OneInput("x", "FP32", "[0]", "[ ]"))),
              ElementsAre());
  // An element error names the element the fast path stopped at.
  ExpectInvalid(OneInput("x", "INT8", "[3]", "[1, 2, 300]"),
                {"input 'x'", "data element 2", "8-bit"});
  ExpectInvalid(OneInput("x", "UINT8", "[3]", "[1, -2, 3]"),
                {"input 'x'", "data element 1"});
}

TEST(ParseRestInferRequest, Fp64RoundTripsAndIsTheNearestDouble) {
  EXPECT_THAT(RawAs<double>(RawOf(OneInput(
                  "x", "FP64", "[5]",
                  "[0.1,-2.5,1.7976931348623157e308,4.9e-324,-0]"))),
              ElementsAre(0.1, -2.5, std::numeric_limits<double>::max(),
                          std::numeric_limits<double>::denorm_min(), 0.0));
  std::mt19937_64 random(7);
  std::vector<double> expected = {std::numeric_limits<double>::denorm_min(),
                                  std::numeric_limits<double>::min(),
                                  std::numeric_limits<double>::max(), -0.0};
  while (expected.size() < 20000) {
    const uint64_t bits = random();
    double value;
    std::memcpy(&value, &bits, sizeof value);
    if (std::isfinite(value)) expected.push_back(value);
  }
  std::string data = "[";
  for (size_t i = 0; i < expected.size(); ++i) {
    if (i > 0) data += ',';
    data += ToChars(expected[i]);
  }
  data += "]";
  const std::vector<double> got = RawAs<double>(RawOf(
      OneInput("x", "FP64", absl::StrCat("[", expected.size(), "]"), data)));
  ASSERT_EQ(got.size(), expected.size());
  int mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (BitsOf(got[i]) != BitsOf(expected[i]) && ++mismatches <= 10) {
      ADD_FAILURE() << ToChars(expected[i]) << " read back as " << ToChars(got[i]);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(ParseRestInferRequest, Fp64BeyondItsRange) {
  ExpectRefusedOrInfinite("FP64", "1.8e308", false);
  ExpectRefusedOrInfinite("FP64", "-1.8e308", true);
  ExpectRefusedOrInfinite("FP64", "1e400", false, /*json_may_refuse=*/true);
  ExpectRefusedOrInfinite("FP64", "-1e309", true, /*json_may_refuse=*/true);
  const std::vector<double> tiny =
      RawAs<double>(RawOf(OneInput("x", "FP64", "[1]", "[1e-400]")));
  ASSERT_EQ(tiny.size(), 1u);
  EXPECT_EQ(tiny[0], 0.0);
}

TEST(ParseRestInferRequest, Bool) {
  EXPECT_THAT(RawAs<uint8_t>(RawOf(OneInput("flags", "BOOL", "[3]",
                                            "[true,false,true]"))),
              ElementsAre(1, 0, 1));
  ExpectInvalid(OneInput("flags", "BOOL", "[2]", "[true,1]"),
                {"input 'flags'", "element 1", "true or false"});
  ExpectInvalid(OneInput("flags", "BOOL", "[1]", "[0]"),
                {"input 'flags'", "true or false"});
  // Numbers' datatypes refuse booleans.
  for (const char* datatype : {"FP32", "FP64", "INT8", "INT32", "UINT64"}) {
    SCOPED_TRACE(datatype);
    ExpectInvalid(OneInput("x", datatype, "[2]", "[1,true]"),
                  {"input 'x'", "element 1"});
  }
}

TEST(ParseRestInferRequest, DatatypesWithoutJsonFormAreRefusedNamingTheInput) {
  for (const char* datatype : {"FP16", "BF16", "BYTES", "FP8", "COMPLEX"}) {
    SCOPED_TRACE(datatype);
    ExpectInvalid(OneInput("half_in", datatype, "[2]", "[1.5,2]"),
                  {"input 'half_in'", datatype});
    ExpectInvalid(OneInput("half_in", datatype, "[1]", "[true]"),
                  {"input 'half_in'", datatype});
    ExpectInvalid(OneInput("half_in", datatype, "[0]", "[]"),
                  {"input 'half_in'", datatype});
    // Data first, datatype after.
    ExpectInvalid(absl::StrCat(R"({"inputs":[{"name":"half_in","data":[1],)"
                               R"("shape":[1],"datatype":")",
                               datatype, R"("}]})"),
                  {"input 'half_in'", datatype});
  }
  // BYTES' JSON form is strings: refused too.
  ExpectInvalid(OneInput("text", "BYTES", "[2]", R"(["ab","cd"])"),
                {"input 'text'"});
  ExpectInvalid(OneInput("text", "FP32", "[1]", R"(["1.5"])"),
                {"input 'text'", "string"});
}

// --- Counts and shapes -------------------------------------------------------------

TEST(ParseRestInferRequest, CountMustMatchTheShape) {
  ExpectInvalid(OneInput("x", "FP32", "[2,2]", "[1,2,3]"),
                {"input 'x'", "[2,2]", "4", "3"});
  ExpectInvalid(OneInput("x", "FP32", "[2,2]", "[[1,2],[3,4],[5]]"),
                {"input 'x'", "4", "5"});
  ExpectInvalid(OneInput("x", "INT32", "[0]", "[1]"), {"input 'x'"});
  ExpectInvalid(OneInput("x", "INT32", "[3,0]", "[[1]]"), {"input 'x'"});
}

TEST(ParseRestInferRequest, CountsAndShapes) {
  EXPECT_EQ(RawOf(OneInput("x", "FP32", "[0]", "[]")), "");
  EXPECT_EQ(RawOf(OneInput("x", "FP32", "[3,0,2]", "[]")), "");
  EXPECT_EQ(RawOf(OneInput("x", "FP32", "[2,0]", "[[],[]]")), "");
  // A scalar: shape [] holds one element.
  EXPECT_THAT(RawAs<int32_t>(RawOf(OneInput("x", "INT32", "[]", "[7]"))),
              ElementsAre(7));
  ExpectInvalid(OneInput("x", "INT32", "[]", "[]"), {"input 'x'"});
  // A product beyond int64 never matches.
  ExpectInvalid(OneInput("x", "FP32", "[4294967296,4294967296]", "[1]"),
                {"input 'x'"});
  ExpectInvalid(OneInput("x", "FP32", "[9223372036854775807,2]", "[1]"),
                {"input 'x'"});
  // Dimensions are non-negative integers.
  ExpectInvalid(OneInput("x", "FP32", "[-1]", "[1]"), {"input 'x'", "shape"});
  ExpectInvalid(OneInput("x", "FP32", "[1.5]", "[1]"), {"input 'x'", "shape"});
  ExpectInvalid(OneInput("x", "FP32", "[1e0]", "[1]"), {"input 'x'", "shape"});
  ExpectInvalid(OneInput("x", "FP32", "[9223372036854775808]", "[1]"),
                {"input 'x'", "shape"});
  ExpectInvalid(OneInput("x", "FP32", "2", "[1,2]"), {"shape"});
  ExpectInvalid(OneInput("x", "FP32", "[[2]]", "[1,2]"), {"shape"});
}

TEST(ParseRestInferRequest, RequiredFieldsOfAnInput) {
  ExpectInvalid(R"({"inputs":[{"datatype":"FP32","shape":[1],"data":[1]}]})",
                {"input 0", "'name'"});
  ExpectInvalid(R"({"inputs":[{"name":"x","shape":[1],"data":[1]}]})",
                {"input 'x'"});
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1]}]})",
                {"input 'x'", "'data'", "binary_data_size"});
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],)"
                R"("data":[1],"data":[2]}]})",
                {"input 'x'", "data"});
}

// --- Binary tensor data ----------------------------------------------------------

struct BinaryBody {
  std::string body;
  uint64_t json_length;
};

BinaryBody WithBinary(const std::string& json, const std::string& binary) {
  return {json + binary, json.size()};
}

TEST(ParseRestInferRequest, BinarySectionsInInputOrder) {
  std::string first(8, '\0');
  for (int i = 0; i < 8; ++i) first[i] = static_cast<char>(0xF0 + i);
  const std::string second = std::string("\x00\x01\x02\x03\xff\xfe\"}", 8) +
                              std::string(4, '\x7f');
  const std::string json =
      R"({"inputs":[)"
      R"({"name":"a","datatype":"FP32","shape":[2],)"
      R"("parameters":{"binary_data_size":8}},)"
      R"({"name":"j","datatype":"INT32","shape":[1],"data":[9]},)"
      R"({"name":"b","datatype":"FP16","shape":[2,3],)"
      R"("parameters":{"binary_data_size":12,"other":"kept"}},)"
      R"({"name":"e","datatype":"BYTES","shape":[0],)"
      R"("parameters":{"binary_data_size":0}}]})";
  const BinaryBody request = WithBinary(json, first + second);
  RestInferRequest out;
  const absl::Status status = Parse(request.body, &out, request.json_length);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(out.request.inputs_size(), 4);
  ASSERT_EQ(out.request.raw_input_contents_size(), 4);
  EXPECT_EQ(out.request.raw_input_contents(0), first);
  EXPECT_THAT(RawAs<int32_t>(out.request.raw_input_contents(1)), ElementsAre(9));
  EXPECT_EQ(out.request.raw_input_contents(2), second);
  EXPECT_EQ(out.request.raw_input_contents(3), "");
  // The extension's own parameter is taken out; others go through.
  EXPECT_FALSE(out.request.inputs(0).parameters().contains("binary_data_size"));
  EXPECT_FALSE(out.request.inputs(2).parameters().contains("binary_data_size"));
  ASSERT_TRUE(out.request.inputs(2).parameters().contains("other"));
  EXPECT_EQ(out.request.inputs(2).parameters().at("other").string_param(),
            "kept");
}

TEST(ParseRestInferRequest, BinarySizesMustAddUpToTheSection) {
  const std::string json =
      R"({"inputs":[)"
      R"({"name":"a","datatype":"FP32","shape":[2],)"
      R"("parameters":{"binary_data_size":8}},)"
      R"({"name":"b","datatype":"FP32","shape":[1],)"
      R"("parameters":{"binary_data_size":4}}]})";
  // Truncated: 11 bytes for 12.
  BinaryBody request = WithBinary(json, std::string(11, 'x'));
  ExpectInvalid(request.body, {"input 'b'", "binary_data_size"},
                request.json_length);
  request = WithBinary(json, std::string(7, 'x'));
  ExpectInvalid(request.body, {"input 'a'", "binary_data_size"},
                request.json_length);
  request = WithBinary(json, "");
  ExpectInvalid(request.body, {"input 'a'"}, request.json_length);
  // Extra bytes: 13 for 12.
  request = WithBinary(json, std::string(13, 'x'));
  ExpectInvalid(request.body, {"13", "12"}, request.json_length);
  // A binary section with no binary input.
  request = WithBinary(OneInput("x", "FP32", "[1]", "[1]"), "abcd");
  ExpectInvalid(request.body, {"4"}, request.json_length);
  // Exactly 12: fine.
  request = WithBinary(json, std::string(12, 'x'));
  RestInferRequest out;
  EXPECT_TRUE(Parse(request.body, &out, request.json_length).ok());
}

TEST(ParseRestInferRequest, HugeBinaryDataSizeIsRefused) {
  for (const char* size : {"9223372036854775807", "4611686018427387904",
                           "18446744073709551615", "18446744073709551616"}) {
    SCOPED_TRACE(size);
    const BinaryBody request = WithBinary(
        absl::StrCat(R"({"inputs":[{"name":"a","datatype":"FP32",)"
                     R"("shape":[1],"parameters":{"binary_data_size":)",
                     size, "}}]}"),
        "abcd");
    ExpectInvalid(request.body, {"binary_data_size"}, request.json_length);
  }
}

TEST(ParseRestInferRequest, HeaderLengthBeyondTheBody) {
  const std::string json = OneInput("x", "FP32", "[1]", "[1]");
  ExpectInvalid(json, {"Inference-Header-Content-Length"}, json.size() + 1);
  ExpectInvalid(json, {"Inference-Header-Content-Length"},
                std::numeric_limits<uint64_t>::max());
  // The whole body: no binary section.
  RestInferRequest out;
  EXPECT_TRUE(Parse(json, &out, json.size()).ok());
  // A header length that cuts the JSON short leaves invalid JSON.
  ExpectInvalid(json, {"not valid JSON"}, json.size() - 1);
  // Zero: no JSON at all.
  ExpectInvalid(json, {}, 0);
}

TEST(ParseRestInferRequest, BinaryWithoutHeaderLengthIsTrailingGarbage) {
  const std::string json =
      R"({"inputs":[{"name":"a","datatype":"FP32","shape":[1],)"
      R"("parameters":{"binary_data_size":4}}]})";
  ExpectInvalid(json + "\x01\x02\x03\x04", {"not valid JSON"});
  // And without the bytes, the binary input runs past the (empty) section.
  ExpectInvalid(json, {"input 'a'", "binary_data_size"});
}

TEST(ParseRestInferRequest, BinaryDataSizeMustBeANonNegativeInteger) {
  for (const char* size : {"-1", "1.5", "4.0", "\"4\"", "true", "1e1"}) {
    SCOPED_TRACE(size);
    const BinaryBody request = WithBinary(
        absl::StrCat(R"({"inputs":[{"name":"a","datatype":"FP32",)"
                     R"("shape":[1],"parameters":{"binary_data_size":)",
                     size, "}}]}"),
        "abcd");
    ExpectInvalid(request.body, {"binary_data_size"}, request.json_length);
  }
  // Both data and binary data.
  const BinaryBody both = WithBinary(
      R"({"inputs":[{"name":"a","datatype":"FP32","shape":[1],"data":[1],)"
      R"("parameters":{"binary_data_size":4}}]})",
      "abcd");
  ExpectInvalid(both.body, {"input 'a'", "binary_data_size", "data"},
                both.json_length);
}

// --- Outputs -------------------------------------------------------------------------

TEST(ParseRestInferRequest, BinaryDataOutputAndPerOutputBinaryData) {
  RestInferRequest out;
  absl::Status status = Parse(
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],)"
      R"("parameters":{"binary_data_output":true,"priority":2},)"
      R"("outputs":[{"name":"a"},)"
      R"({"parameters":{"binary_data":false,"k":"v"},"name":"b"},)"
      R"({"name":"c","parameters":{"binary_data":true}}]})",
      &out);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(out.binary_data_output);
  EXPECT_TRUE(out.Binary("a"));
  EXPECT_FALSE(out.Binary("b"));
  EXPECT_TRUE(out.Binary("c"));
  EXPECT_TRUE(out.Binary("not_requested"));
  // binary_data and binary_data_output are the extension's, not parameters.
  EXPECT_FALSE(out.request.parameters().contains("binary_data_output"));
  ASSERT_TRUE(out.request.parameters().contains("priority"));
  EXPECT_EQ(out.request.parameters().at("priority").int64_param(), 2);
  ASSERT_EQ(out.request.outputs_size(), 3);
  EXPECT_EQ(out.request.outputs(1).name(), "b");
  EXPECT_FALSE(out.request.outputs(1).parameters().contains("binary_data"));
  ASSERT_TRUE(out.request.outputs(1).parameters().contains("k"));
  EXPECT_EQ(out.request.outputs(1).parameters().at("k").string_param(), "v");

  status = Parse(
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],)"
      R"("outputs":[{"name":"a","parameters":{"binary_data":true}},)"
      R"({"name":"b"}]})",
      &out);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_FALSE(out.binary_data_output);
  EXPECT_TRUE(out.Binary("a"));
  EXPECT_FALSE(out.Binary("b"));
  EXPECT_FALSE(out.Binary("other"));
}

TEST(ParseRestInferRequest, BinaryDataFlagsMustBeBooleans) {
  const std::string input =
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],)";
  for (const char* value : {"1", "0", "\"true\"", "1.5"}) {
    SCOPED_TRACE(value);
    ExpectInvalid(absl::StrCat(input, R"("parameters":{"binary_data_output":)",
                               value, "}}"),
                  {"binary_data_output"});
    ExpectInvalid(absl::StrCat(input, R"("outputs":[{"name":"y",)"
                                      R"("parameters":{"binary_data":)",
                               value, "}}]}"),
                  {"binary_data"});
  }
}

// --- Parameters ------------------------------------------------------------------------

TEST(ParseRestInferRequest, ParametersAreTyped) {
  RestInferRequest out;
  const absl::Status status = Parse(
      R"({"parameters":{"t":true,"f":false,"i":-42,"zero":0,)"
      R"("max":9223372036854775807,"min":-9223372036854775808,)"
      R"("u":9223372036854775808,"umax":18446744073709551615,)"
      R"("d":1.5,"e":1e3,"neg":-2.5e-3,"big":18446744073709551616,)"
      R"("s":"text","empty":""},)"
      R"("inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],)"
      R"("parameters":{"in":7}}],)"
      R"("outputs":[{"name":"y","parameters":{"out":"o"}}]})",
      &out);
  ASSERT_TRUE(status.ok()) << status;
  const auto& p = out.request.parameters();
  using inference::InferParameter;
  auto choice = [&](const char* name) {
    return p.contains(name) ? p.at(name).parameter_choice_case()
                            : InferParameter::PARAMETER_CHOICE_NOT_SET;
  };
  EXPECT_EQ(choice("t"), InferParameter::kBoolParam);
  EXPECT_TRUE(p.at("t").bool_param());
  EXPECT_EQ(choice("f"), InferParameter::kBoolParam);
  EXPECT_FALSE(p.at("f").bool_param());
  EXPECT_EQ(choice("i"), InferParameter::kInt64Param);
  EXPECT_EQ(p.at("i").int64_param(), -42);
  EXPECT_EQ(choice("zero"), InferParameter::kInt64Param);
  EXPECT_EQ(choice("max"), InferParameter::kInt64Param);
  EXPECT_EQ(p.at("max").int64_param(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(choice("min"), InferParameter::kInt64Param);
  EXPECT_EQ(p.at("min").int64_param(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(choice("u"), InferParameter::kUint64Param);
  EXPECT_EQ(p.at("u").uint64_param(), uint64_t{9223372036854775808u});
  EXPECT_EQ(choice("umax"), InferParameter::kUint64Param);
  EXPECT_EQ(p.at("umax").uint64_param(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(choice("d"), InferParameter::kDoubleParam);
  EXPECT_EQ(p.at("d").double_param(), 1.5);
  EXPECT_EQ(choice("e"), InferParameter::kDoubleParam);
  EXPECT_EQ(p.at("e").double_param(), 1000.0);
  EXPECT_EQ(choice("neg"), InferParameter::kDoubleParam);
  EXPECT_EQ(p.at("neg").double_param(), -2.5e-3);
  // Beyond uint64: a double.
  EXPECT_EQ(choice("big"), InferParameter::kDoubleParam);
  EXPECT_EQ(p.at("big").double_param(), 18446744073709551616.0);
  EXPECT_EQ(choice("s"), InferParameter::kStringParam);
  EXPECT_EQ(p.at("s").string_param(), "text");
  EXPECT_EQ(choice("empty"), InferParameter::kStringParam);
  ASSERT_TRUE(out.request.inputs(0).parameters().contains("in"));
  EXPECT_EQ(out.request.inputs(0).parameters().at("in").int64_param(), 7);
  ASSERT_TRUE(out.request.outputs(0).parameters().contains("out"));
  EXPECT_EQ(out.request.outputs(0).parameters().at("out").string_param(), "o");
}

TEST(ParseRestInferRequest, DoubleParameterBeyondDoubleRange) {
  // 1.8e308 is no double: refused naming the parameter, or the infinity of
  // its sign; never 0. (1e400: RapidJSON refuses it as not valid JSON.)
  struct Case {
    const char* text;
    bool negative;
    bool json_may_refuse;
  };
  for (const Case& c : {Case{"1.8e308", false, false},
                        Case{"-1.8e308", true, false},
                        Case{"1e400", false, true}}) {
    SCOPED_TRACE(c.text);
    RestInferRequest out;
    const absl::Status status = Parse(
        absl::StrCat(R"({"parameters":{"huge":)", c.text,
                     R"(},"inputs":[{"name":"x","datatype":"FP32",)"
                     R"("shape":[1],"data":[1]}]})"),
        &out);
    if (!status.ok()) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      if (!c.json_may_refuse) {
        EXPECT_THAT(std::string(status.message()), HasSubstr("huge"));
      }
      continue;
    }
    ASSERT_TRUE(out.request.parameters().contains("huge"));
    const double value = out.request.parameters().at("huge").double_param();
    EXPECT_TRUE(std::isinf(value)) << c.text << " became " << value;
    EXPECT_EQ(std::signbit(value), c.negative);
  }
}

TEST(ParseRestInferRequest, ParametersHoldScalarsOnly) {
  const std::string input =
      R"("inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}])";
  ExpectInvalid(absl::StrCat(R"({"parameters":{"nested":{"a":1}},)", input, "}"),
                {"'nested'"});
  ExpectInvalid(absl::StrCat(R"({"parameters":{"list":[1,2]},)", input, "}"),
                {"'list'"});
  ExpectInvalid(absl::StrCat(R"({"parameters":{"nothing":null},)", input, "}"),
                {"'nothing'", "null"});
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],)"
                R"("data":[1],"parameters":{"deep":{}}}]})",
                {"'deep'"});
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],)"
                R"("data":[1]}],"outputs":[{"name":"y","parameters":)"
                R"({"o":{"p":true}}}]})",
                {"'o'"});
  ExpectInvalid(absl::StrCat(R"({"parameters":[1],)", input, "}"),
                {"'parameters'"});
  ExpectInvalid(absl::StrCat(R"({"parameters":"x",)", input, "}"),
                {"'parameters'"});
}

// --- Unknown fields, wrong types -------------------------------------------------------

TEST(ParseRestInferRequest, UnknownFieldsAreRefusedByName) {
  const std::string input =
      R"({"name":"x","datatype":"FP32","shape":[1],"data":[1])";
  // At the top, in an input and in an output, of every JSON type.
  for (const char* value : {"\"s\"", "1", "true", "{}", "[]", "null"}) {
    SCOPED_TRACE(value);
    ExpectInvalid(absl::StrCat(R"({"inputs":[)", input, R"(}],"model_nam":)",
                               value, "}"),
                  {"'model_nam'"});
    ExpectInvalid(absl::StrCat(R"({"inputs":[)", input, R"(,"contents":)", value,
                               "}]}"),
                  {"'contents'"});
    ExpectInvalid(absl::StrCat(R"({"inputs":[)", input,
                               R"(}],"outputs":[{"name":"y","shap":)", value,
                               "}]}"),
                  {"'shap'"});
  }
}

TEST(ParseRestInferRequest, KnownFieldsOfTheWrongTypeAreRefused) {
  ExpectInvalid(R"({"id":5,"inputs":[]})", {"'id'"});
  ExpectInvalid(R"({"inputs":{}})", {"inputs"});
  ExpectInvalid(R"({"inputs":"x"})", {"inputs"});
  ExpectInvalid(R"({"inputs":[1]})", {"inputs"});
  ExpectInvalid(R"({"inputs":[[]]})", {"inputs"});
  ExpectInvalid(R"({"outputs":{}})", {"outputs"});
  ExpectInvalid(R"({"outputs":["y"]})", {"outputs"});
  ExpectInvalid(R"({"inputs":[{"name":5,"datatype":"FP32","shape":[1],)"
                R"("data":[1]}]})",
                {"'name'"});
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":11,"shape":[1],)"
                R"("data":[1]}]})",
                {"'datatype'"});
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],)"
                R"("data":{"a":1}}]})",
                {"data"});
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],)"
                R"("data":1}]})",
                {"'data'"});
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],)"
                R"("data":[1]}],"outputs":[{"name":true}]})",
                {"'name'"});
}

// An error inside one input's data or shape names that input, as every
// other error about the input does.
TEST(ParseRestInferRequest, ErrorsInsideDataAndShapeNameTheInput) {
  ExpectInvalid(OneInput("named_in", "FP32", "[2]", "[1,null]"),
                {"input 'named_in'"});
  ExpectInvalid(OneInput("named_in", "FP32", "[1]", "[{}]"),
                {"input 'named_in'"});
  ExpectInvalid(OneInput("named_in", "FP32", R"(["1"])", "[1]"),
                {"input 'named_in'"});
  ExpectInvalid(OneInput("named_in", "FP32", "[null]", "[1]"),
                {"input 'named_in'"});
}

// --- Malformed JSON -------------------------------------------------------------------

TEST(ParseRestInferRequest, MalformedJsonSaysSoWithTheByteOffset) {
  const std::string bodies[] = {
      "{",
      R"({"inputs":[)",
      R"({"inputs":[}])",
      R"({"id":"x",})",
      R"({'id':'x'})",
      R"({"id":"x" "inputs":[]})",
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[NaN]}]})",
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[+1]}]})",
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[01]}]})",
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1.]}]})",
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[Infinity]}]})",
      "{\"id\":\"\xff\xfe\"}",           // not UTF-8
      "{\"id\":\"a\x01\"}",              // control character in a string
      "{/* comment */}",
      "nope",
      " ",
  };
  for (const std::string& body : bodies) {
    SCOPED_TRACE(body);
    RestInferRequest out;
    const absl::Status status = Parse(body, &out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr("not valid JSON"),
                      ContainsRegex("at byte [0-9]+")));
  }
}

TEST(ParseRestInferRequest, MalformedJsonOffsetPointsAtTheFault) {
  // The fault is the '@' at byte 10.
  const std::string body = R"({"id":"x" @})";
  ASSERT_EQ(body.find('@'), 10u);
  ExpectInvalid(body, {"not valid JSON", "at byte 10"});
}

TEST(ParseRestInferRequest, EmptyBodyIsRefused) {
  ExpectInvalid("", {});
}

TEST(ParseRestInferRequest, TopLevelMustBeAnObject) {
  for (const char* body : {"[]", "1", "\"s\"", "null", "true"}) {
    SCOPED_TRACE(body);
    ExpectInvalid(body, {});
  }
}

TEST(ParseRestInferRequest, TrailingGarbageIsRefused) {
  const std::string json = OneInput("x", "FP32", "[1]", "[1]");
  ExpectInvalid(json + " x",
                {"not valid JSON", absl::StrCat("at byte ", json.size() + 1)});
  ExpectInvalid(json + "{}",
                {"not valid JSON", absl::StrCat("at byte ", json.size())});
  ExpectInvalid(json + std::string(1, '\0'), {"not valid JSON"});
  // Whitespace after the object is fine.
  RestInferRequest out;
  EXPECT_TRUE(Parse(json + " \r\n\t ", &out).ok());
  EXPECT_TRUE(Parse(" \n" + json, &out).ok());
}

TEST(ParseRestInferRequest, ResetsTheOutputBeforeParsing) {
  RestInferRequest out;
  out.binary_data_output = true;
  out.output_binary["stale"] = true;
  out.request.add_raw_input_contents("stale");
  ASSERT_TRUE(Parse(OneInput("x", "FP32", "[1]", "[1]"), &out).ok());
  EXPECT_FALSE(out.binary_data_output);
  EXPECT_TRUE(out.output_binary.empty());
  EXPECT_EQ(out.request.raw_input_contents_size(), 1);
}

TEST(ParseRestInferRequest, StringsAreUnescaped) {
  RestInferRequest out;
  ASSERT_TRUE(Parse(R"({"id":"a\"b\\c\u00e9\n","inputs":[{"name":"\u0078",)"
                    R"("datatype":"FP32","shape":[1],"data":[1]}]})",
                    &out)
                  .ok());
  EXPECT_EQ(out.request.id(), "a\"b\\c\xc3\xa9\n");
  EXPECT_EQ(out.request.inputs(0).name(), "x");
}

// --- The response writer -----------------------------------------------------------------

inference::ModelInferResponse Response(const std::string& id) {
  inference::ModelInferResponse response;
  response.set_model_name("attention \"v\"");
  response.set_model_version("1");
  response.set_id(id);
  return response;
}

void AddOutput(inference::ModelInferResponse* response, const std::string& name,
               const std::string& datatype, std::vector<int64_t> shape,
               std::string raw) {
  auto* output = response->add_outputs();
  output->set_name(name);
  output->set_datatype(datatype);
  for (int64_t dimension : shape) output->add_shape(dimension);
  response->add_raw_output_contents(std::move(raw));
}

template <typename T>
std::string RawBytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

TEST(WriteRestInferResponse, JsonDataRoundTripsBitExactly) {
  std::mt19937 random(99);
  std::vector<float> values = {0.0f,
                               -0.0f,
                               0.1f,
                               -1.0f / 3.0f,
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::lowest(),
                               16777216.0f,
                               1e-30f};
  while (values.size() < 20000) {
    const uint32_t bits = random();
    float value;
    std::memcpy(&value, &bits, sizeof value);
    if (std::isfinite(value)) values.push_back(value);
  }
  RestInferRequest request;
  ASSERT_TRUE(Parse(R"({"id":"q\"1","inputs":[{"name":"x","datatype":"FP32",)"
                    R"("shape":[1],"data":[1]}]})",
                    &request)
                  .ok());
  inference::ModelInferResponse response = Response(request.request.id());
  AddOutput(&response, "output", "FP32",
            {2, static_cast<int64_t>(values.size() / 2)}, RawBytes(values));
  AddOutput(&response, "empty", "FP32", {0}, "");
  RestBody body;
  WriteRestInferResponse(request, response, &body);
  EXPECT_FALSE(body.json_length.has_value());

  const rapidjson::Document document = ParseDocument(body.bytes);
  ASSERT_TRUE(document.IsObject());
  EXPECT_EQ(Text(document["model_name"]), "attention \"v\"");
  EXPECT_EQ(Text(document["model_version"]), "1");
  ASSERT_TRUE(document.HasMember("id"));
  EXPECT_EQ(Text(document["id"]), "q\"1");
  const rapidjson::Value& outputs = document["outputs"];
  ASSERT_TRUE(outputs.IsArray());
  ASSERT_EQ(outputs.Size(), 2u);
  const rapidjson::Value& output = outputs[0];
  EXPECT_EQ(Text(output["name"]), "output");
  EXPECT_EQ(Text(output["datatype"]), "FP32");
  ASSERT_TRUE(output["shape"].IsArray());
  ASSERT_EQ(output["shape"].Size(), 2u);
  EXPECT_EQ(Text(output["shape"][0]), "2");
  EXPECT_EQ(Text(output["shape"][1]), absl::StrCat(values.size() / 2));
  EXPECT_FALSE(output.HasMember("parameters"));
  const rapidjson::Value& data = output["data"];
  ASSERT_TRUE(data.IsArray());
  ASSERT_EQ(data.Size(), values.size());
  int mismatches = 0;
  for (rapidjson::SizeType i = 0; i < data.Size(); ++i) {
    // Numbers (kept as their text by the parse), read back exactly.
    ASSERT_TRUE(data[i].IsString()) << i;
    const std::string text = Text(data[i]);
    float back = 0;
    auto [end, error] =
        std::from_chars(text.data(), text.data() + text.size(), back);
    const bool exact = error == std::errc() && end == text.data() + text.size() &&
                       BitsOf(back) == BitsOf(values[i]);
    // Shortest: no longer than std::to_chars' shortest form; -0 as "-0.0",
    // which parsers that read "-0" as the integer 0 keep negative.
    const bool shortest =
        text.size() <= ToChars(values[i]).size() ||
        (values[i] == 0 && std::signbit(values[i]) && text == "-0.0");
    if ((!exact || !shortest) && ++mismatches <= 10) {
      ADD_FAILURE() << ToChars(values[i]) << " written as " << text;
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(outputs[1]["data"].Size(), 0u);
}

TEST(WriteRestInferResponse, JsonDataParsesBackThroughTheRequestParser) {
  // What the server writes, a client can send back: the same floats.
  const std::vector<float> values = {1.5f, -0.0f, 3.4028235e38f, 1e-45f, 0.3f};
  RestInferRequest request;
  inference::ModelInferResponse response = Response("");
  AddOutput(&response, "y", "FP32", {5}, RawBytes(values));
  RestBody body;
  WriteRestInferResponse(request, response, &body);
  const rapidjson::Document document = ParseDocument(body.bytes);
  const std::string data_start = "\"data\":";
  const size_t at = body.bytes.find(data_start);
  ASSERT_NE(at, std::string::npos);
  const size_t end = body.bytes.find(']', at);
  const std::string data =
      body.bytes.substr(at + data_start.size(), end + 1 - at - data_start.size());
  const std::string raw = RawOf(OneInput("y", "FP32", "[5]", data));
  EXPECT_EQ(raw, RawBytes(values));
  // No id in the response: none written.
  EXPECT_FALSE(document.HasMember("id"));
}

TEST(WriteRestInferResponse, BinaryOutputs) {
  RestInferRequest request;
  ASSERT_TRUE(Parse(R"({"id":"r7","parameters":{"binary_data_output":true},)"
                    R"("inputs":[{"name":"x","datatype":"FP32","shape":[1],)"
                    R"("data":[1]}],"outputs":[{"name":"weights",)"
                    R"("parameters":{"binary_data":false}}]})",
                    &request)
                  .ok());
  const std::vector<float> first = {1.0f, -2.0f, 0.5f};
  const std::vector<float> weights = {0.25f, 0.75f};
  const std::vector<float> third = {42.0f};
  inference::ModelInferResponse response = Response("r7");
  AddOutput(&response, "output", "FP32", {3}, RawBytes(first));
  AddOutput(&response, "weights", "FP32", {1, 2}, RawBytes(weights));
  AddOutput(&response, "third", "FP32", {1}, RawBytes(third));
  RestBody body;
  WriteRestInferResponse(request, response, &body);
  ASSERT_TRUE(body.json_length.has_value());
  ASSERT_LE(*body.json_length, body.bytes.size());
  const std::string json = body.bytes.substr(0, *body.json_length);
  const std::string binary = body.bytes.substr(*body.json_length);
  EXPECT_EQ(binary, RawBytes(first) + RawBytes(third));

  const rapidjson::Document document = ParseDocument(json);
  EXPECT_EQ(Text(document["id"]), "r7");
  const rapidjson::Value& outputs = document["outputs"];
  ASSERT_EQ(outputs.Size(), 3u);
  EXPECT_EQ(Text(outputs[0]["name"]), "output");
  EXPECT_FALSE(outputs[0].HasMember("data"));
  EXPECT_EQ(Text(outputs[0]["parameters"]["binary_data_size"]), "12");
  EXPECT_EQ(Text(outputs[0]["shape"][0]), "3");
  // binary_data false for this one: JSON data.
  EXPECT_FALSE(outputs[1].HasMember("parameters"));
  ASSERT_TRUE(outputs[1]["data"].IsArray());
  ASSERT_EQ(outputs[1]["data"].Size(), 2u);
  EXPECT_EQ(Text(outputs[1]["data"][0]), "0.25");
  EXPECT_EQ(Text(outputs[2]["parameters"]["binary_data_size"]), "4");
}

TEST(WriteRestInferResponse, OutputsOtherThanFp32GoAsBinary) {
  RestInferRequest request;  // JSON for every output
  inference::ModelInferResponse response = Response("");
  const std::vector<int32_t> ints = {1, -1, 7};
  const std::vector<double> doubles = {0.1};
  AddOutput(&response, "i", "INT32", {3}, RawBytes(ints));
  AddOutput(&response, "f", "FP32", {1}, RawBytes(std::vector<float>{2.0f}));
  AddOutput(&response, "d", "FP64", {1}, RawBytes(doubles));
  RestBody body;
  WriteRestInferResponse(request, response, &body);
  ASSERT_TRUE(body.json_length.has_value());
  EXPECT_EQ(body.bytes.substr(*body.json_length),
            RawBytes(ints) + RawBytes(doubles));
  const rapidjson::Document document =
      ParseDocument(body.bytes.substr(0, *body.json_length));
  const rapidjson::Value& outputs = document["outputs"];
  ASSERT_EQ(outputs.Size(), 3u);
  EXPECT_EQ(Text(outputs[0]["parameters"]["binary_data_size"]), "12");
  EXPECT_EQ(Text(outputs[1]["data"][0]), "2");
  EXPECT_EQ(Text(outputs[2]["parameters"]["binary_data_size"]), "8");
  EXPECT_EQ(Text(outputs[2]["datatype"]), "FP64");
}

TEST(WriteRestInferResponse, NoOutputs) {
  RestInferRequest request;
  RestBody body;
  body.json_length = 5;  // stale: reset
  body.bytes = "stale";
  WriteRestInferResponse(request, Response("abc"), &body);
  EXPECT_FALSE(body.json_length.has_value());
  const rapidjson::Document document = ParseDocument(body.bytes);
  EXPECT_EQ(Text(document["id"]), "abc");
  EXPECT_EQ(document["outputs"].Size(), 0u);
}

TEST(WriteRestInferResponse, OutputWithoutRawContentsDoesNotCrash) {
  // An output the response lists without raw contents (a response filled
  // with fewer raw_output_contents than outputs): whatever the writer
  // says of it, it must not read past raw_output_contents. Run in a child,
  // so that a crash fails this test only.
  EXPECT_EXIT(
      {
        RestInferRequest request;
        request.binary_data_output = true;
        inference::ModelInferResponse response = Response("");
        AddOutput(&response, "a", "FP32", {1}, RawBytes(std::vector<float>{1}));
        for (int i = 0; i < 64; ++i) {
          auto* output = response.add_outputs();
          output->set_name(absl::StrCat("no_raw_", i));
          output->set_datatype("INT32");
          output->add_shape(0);
        }
        RestBody body;
        WriteRestInferResponse(request, response, &body);
        std::fprintf(stderr, "wrote %zu bytes\n", body.bytes.size());
        std::exit(body.json_length.has_value() &&
                          body.bytes.size() == *body.json_length + 4
                      ? 0
                      : 3);
      },
      ::testing::ExitedWithCode(0), "wrote");
}

// --- MessageToRestJson ------------------------------------------------------------------

TEST(MessageToRestJson, Int64AsNumbersAndFieldNamesAsInTheProto) {
  inference::ModelStatistics stats;
  stats.set_name("m");
  stats.set_version("2");
  stats.set_last_inference(18446744073709551615u);
  stats.set_inference_count(9007199254740993u);
  stats.mutable_inference_stats()->mutable_success()->set_count(3);
  stats.mutable_inference_stats()->mutable_success()->set_ns(1234567890123);
  auto* memory = stats.add_memory_usage();
  memory->set_type("CPU");
  memory->set_id(-9223372036854775807 - 1);
  memory->set_byte_size(0);
  const std::string json = MessageToRestJson(stats);
  const rapidjson::Document document = ParseDocument(json);
  ASSERT_TRUE(document.IsObject());
  // Numbers, not strings: kept as their text by the parse, so the check is
  // on the source.
  EXPECT_THAT(json, HasSubstr("\"last_inference\":18446744073709551615"));
  EXPECT_THAT(json, HasSubstr("\"inference_count\":9007199254740993"));
  EXPECT_THAT(json, HasSubstr("\"id\":-9223372036854775808"));
  EXPECT_THAT(json, HasSubstr("\"ns\":1234567890123"));
  EXPECT_EQ(Text(document["name"]), "m");
  EXPECT_EQ(Text(document["inference_stats"]["success"]["count"]), "3");
  ASSERT_TRUE(document["memory_usage"].IsArray());
  EXPECT_EQ(Text(document["memory_usage"][0]["type"]), "CPU");
  EXPECT_THAT(json, Not(HasSubstr("lastInference")));
}

TEST(MessageToRestJson, ZeroScalarsArePresentUnsetMessagesAreNot) {
  inference::ModelStatistics stats;
  stats.set_name("m");
  const std::string json = MessageToRestJson(stats);
  const rapidjson::Document document = ParseDocument(json);
  ASSERT_TRUE(document.HasMember("inference_count"));
  EXPECT_EQ(Text(document["inference_count"]), "0");
  ASSERT_TRUE(document.HasMember("execution_count"));
  EXPECT_EQ(Text(document["execution_count"]), "0");
  ASSERT_TRUE(document.HasMember("version"));
  EXPECT_EQ(Text(document["version"]), "");
  // Unset message fields and empty repeated fields and maps are left out.
  EXPECT_FALSE(document.HasMember("inference_stats"));
  EXPECT_FALSE(document.HasMember("batch_stats"));
  EXPECT_FALSE(document.HasMember("response_stats"));
  // A set message holds its zero scalars too.
  stats.mutable_inference_stats()->mutable_fail();
  const rapidjson::Document with_stats = ParseDocument(MessageToRestJson(stats));
  EXPECT_EQ(Text(with_stats["inference_stats"]["fail"]["count"]), "0");
  EXPECT_EQ(Text(with_stats["inference_stats"]["fail"]["ns"]), "0");
}

TEST(MessageToRestJson, EnumsByNameAndBools) {
  inference::ModelConfig config;
  config.set_name("attn");
  config.set_max_batch_size(8);
  auto* input = config.add_input();
  input->set_name("queries");
  input->set_data_type(inference::TYPE_FP32);
  input->add_dims(-1);
  input->add_dims(64);
  input->set_optional(true);
  auto* group = config.add_instance_group();
  group->set_kind(inference::ModelInstanceGroup::KIND_CPU);
  group->add_gpus(0);
  group->add_gpus(1);
  auto* output = config.add_output();
  output->set_name("output");  // data_type left at TYPE_INVALID (0)
  const std::string json = MessageToRestJson(config);
  const rapidjson::Document document = ParseDocument(json);
  EXPECT_EQ(Text(document["input"][0]["data_type"]), "TYPE_FP32");
  EXPECT_EQ(Text(document["instance_group"][0]["kind"]), "KIND_CPU");
  EXPECT_EQ(Text(document["output"][0]["data_type"]), "TYPE_INVALID");
  EXPECT_THAT(json, HasSubstr("\"dims\":[-1,64]"));
  EXPECT_THAT(json, HasSubstr("\"gpus\":[0,1]"));
  EXPECT_THAT(json, HasSubstr("\"optional\":true"));
  EXPECT_THAT(json, HasSubstr("\"allow_ragged_batch\":false"));
  EXPECT_THAT(json, HasSubstr("\"max_batch_size\":8"));
  // The oneof left unset is left out.
  EXPECT_FALSE(document.HasMember("dynamic_batching"));
}

TEST(MessageToRestJson, MapsAsObjects) {
  inference::ModelConfig config;
  config.set_name("m");
  (*config.mutable_parameters())["bandwidth"].set_string_value("0.5");
  (*config.mutable_parameters())["quote\"key"].set_string_value("v");
  auto* batching = config.mutable_dynamic_batching();
  batching->set_max_queue_delay_microseconds(100);
  (*batching->mutable_priority_queue_policy())[18446744073709551615u]
      .set_timeout_action(inference::ModelQueuePolicy::DELAY);
  (*batching->mutable_priority_queue_policy())[2].set_max_queue_size(5);
  const std::string json = MessageToRestJson(config);
  const rapidjson::Document document = ParseDocument(json);
  const rapidjson::Value& parameters = document["parameters"];
  ASSERT_TRUE(parameters.IsObject());
  EXPECT_EQ(parameters.MemberCount(), 2u);
  EXPECT_EQ(Text(parameters["bandwidth"]["string_value"]), "0.5");
  EXPECT_EQ(Text(parameters["quote\"key"]["string_value"]), "v");
  // Integer keys become strings, as JSON object keys must be.
  const rapidjson::Value& policies =
      document["dynamic_batching"]["priority_queue_policy"];
  ASSERT_TRUE(policies.IsObject());
  ASSERT_TRUE(policies.HasMember("18446744073709551615"));
  EXPECT_EQ(Text(policies["18446744073709551615"]["timeout_action"]), "DELAY");
  ASSERT_TRUE(policies.HasMember("2"));
  EXPECT_EQ(Text(policies["2"]["max_queue_size"]), "5");

  // A map of oneof messages; bytes as base64.
  inference::RepositoryModelLoadRequest load;
  load.set_model_name("m");
  (*load.mutable_parameters())["config"].set_string_param("{\"a\":1}");
  (*load.mutable_parameters())["n"].set_int64_param(-3);
  (*load.mutable_parameters())["b"].set_bool_param(false);
  (*load.mutable_parameters())["file:w"].set_bytes_param(std::string("\x00\xff", 2));
  const rapidjson::Document load_document = ParseDocument(MessageToRestJson(load));
  const rapidjson::Value& load_parameters = load_document["parameters"];
  EXPECT_EQ(Text(load_parameters["config"]["string_param"]), "{\"a\":1}");
  EXPECT_EQ(Text(load_parameters["n"]["int64_param"]), "-3");
  ASSERT_TRUE(load_parameters["b"].HasMember("bool_param"));
  EXPECT_TRUE(load_parameters["b"]["bool_param"].IsFalse());
  EXPECT_FALSE(load_parameters["b"].HasMember("int64_param"));
  EXPECT_EQ(Text(load_parameters["file:w"]["bytes_param"]), "AP8=");
}

TEST(MessageToRestJson, EmptyMessage) {
  inference::RepositoryModelLoadResponse empty;
  EXPECT_EQ(MessageToRestJson(empty), "{}");
  inference::RepositoryIndexResponse index;
  auto* model = index.add_models();
  model->set_name("a\nb");
  model->set_state("READY");
  const rapidjson::Document document = ParseDocument(MessageToRestJson(index));
  EXPECT_EQ(Text(document["models"][0]["name"]), "a\nb");
  EXPECT_EQ(Text(document["models"][0]["reason"]), "");
}

// --- JsonString, RestErrorBody, HttpStatusOf -----------------------------------------

TEST(JsonString, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonString(""), "\"\"");
  EXPECT_EQ(JsonString("plain \xc3\xa9"), "\"plain \xc3\xa9\"");
  EXPECT_EQ(JsonString("a\"b\\c\nd\re\tf"), R"("a\"b\\c\nd\re\tf")");
  const std::string controls = std::string("\x00\x01\x1f\x7f", 4);
  const std::string written = JsonString(controls);
  for (char c : written) {
    EXPECT_GE(static_cast<unsigned char>(c), 0x20) << written;
  }
  const rapidjson::Document document =
      ParseDocument(absl::StrCat("[", written, "]"));
  EXPECT_EQ(Text(document[0]), controls);
  // Every byte below 0x20 reads back.
  std::string all;
  for (int c = 0; c < 0x20; ++c) all.push_back(static_cast<char>(c));
  all += "\"\\/";
  const rapidjson::Document every =
      ParseDocument(absl::StrCat("[", JsonString(all), "]"));
  EXPECT_EQ(Text(every[0]), all);
}

TEST(RestErrorBody, IsAnObjectWithTheMessage) {
  const std::string message = "input 'x\"y': bad\n\x01 \\ end";
  const std::string body = RestErrorBody(absl::InvalidArgumentError(message));
  const rapidjson::Document document = ParseDocument(body);
  ASSERT_TRUE(document.IsObject());
  EXPECT_EQ(document.MemberCount(), 1u);
  ASSERT_TRUE(document.HasMember("error"));
  EXPECT_EQ(Text(document["error"]), message);
  EXPECT_EQ(RestErrorBody(absl::NotFoundError("no \"m\"")),
            R"({"error":"no \"m\""})");
  EXPECT_EQ(RestErrorBody(absl::InternalError("")), R"({"error":""})");
}

TEST(HttpStatusOf, EveryCode) {
  using absl::StatusCode;
  const std::pair<StatusCode, int> cases[] = {
      {StatusCode::kOk, 200},
      {StatusCode::kCancelled, 499},
      {StatusCode::kUnknown, 500},
      {StatusCode::kInvalidArgument, 400},
      {StatusCode::kDeadlineExceeded, 504},
      {StatusCode::kNotFound, 404},
      {StatusCode::kAlreadyExists, 409},
      {StatusCode::kPermissionDenied, 403},
      {StatusCode::kResourceExhausted, 429},
      {StatusCode::kFailedPrecondition, 400},
      {StatusCode::kAborted, 409},
      {StatusCode::kOutOfRange, 400},
      {StatusCode::kUnimplemented, 501},
      {StatusCode::kInternal, 500},
      {StatusCode::kUnavailable, 503},
      {StatusCode::kDataLoss, 500},
      {StatusCode::kUnauthenticated, 401},
  };
  for (const auto& [code, http] : cases) {
    EXPECT_EQ(HttpStatusOf(code), http) << absl::StatusCodeToString(code);
  }
  // A code outside the enumeration: 500.
  EXPECT_EQ(HttpStatusOf(static_cast<StatusCode>(42)), 500);
}

// --- Repository bodies -------------------------------------------------------------

TEST(ParseRestRepositoryParameters, EmptyBodiesAreFine) {
  for (const char* body : {"", "  \r\n\t", "{}", R"({"parameters":{}})",
                           " {\"parameters\" : { } } \n"}) {
    SCOPED_TRACE(body);
    google::protobuf::Map<std::string, inference::ModelRepositoryParameter>
        parameters;
    EXPECT_TRUE(ParseRestRepositoryParameters(body, &parameters).ok());
    EXPECT_TRUE(parameters.empty());
  }
}

TEST(ParseRestRepositoryParameters, ScalarsAreTyped) {
  google::protobuf::Map<std::string, inference::ModelRepositoryParameter>
      parameters;
  const absl::Status status = ParseRestRepositoryParameters(
      R"({"parameters":{"config":"{\"max_batch_size\":4}","flag":true,)"
      R"("off":false,"n":-12,"big":9223372036854775807}})",
      &parameters);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(parameters.size(), 5u);
  EXPECT_EQ(parameters.at("config").string_param(), "{\"max_batch_size\":4}");
  EXPECT_TRUE(parameters.at("flag").bool_param());
  EXPECT_EQ(parameters.at("off").parameter_choice_case(),
            inference::ModelRepositoryParameter::kBoolParam);
  EXPECT_FALSE(parameters.at("off").bool_param());
  EXPECT_EQ(parameters.at("n").int64_param(), -12);
  EXPECT_EQ(parameters.at("big").int64_param(),
            std::numeric_limits<int64_t>::max());
}

TEST(ParseRestRepositoryParameters, WrongShapesAreRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"parameters":5})", "parameters"},
      {R"({"parameters":"x"})", "parameters"},
      {R"({"parameters":[]})", "parameters"},
      {R"({"parameters":null})", "null"},
      {R"({"parameters":{"x":{}}})", "'x'"},
      {R"({"parameters":{"x":[1]}})", "'x'"},
      {R"({"parameters":{"x":null}})", "null"},
      {R"({"parameters":{"x":1.5}})", "'x'"},
      {R"({"parameters":{"x":1e2}})", "'x'"},
      {R"({"parameters":{"x":9223372036854775808}})", "'x'"},
      {R"({"parameters":{"parameters":{}}})", "'parameters'"},
      {R"({"other":1})", "'other'"},
      {R"({"other":{}})", "'other'"},
      {R"({"x":{"parameters":{}}})", "'x'"},
      {"[]", ""},
      {"5", ""},
      {"\"parameters\"", ""},
      {"{", "not valid JSON"},
      {R"({"parameters":{}} x)", "not valid JSON"},
      {R"({"parameters":{}}{})", "not valid JSON"},
  };
  for (const auto& [body, part] : cases) {
    SCOPED_TRACE(body);
    google::protobuf::Map<std::string, inference::ModelRepositoryParameter>
        parameters;
    const absl::Status status = ParseRestRepositoryParameters(body, &parameters);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_FALSE(status.message().empty());
    EXPECT_THAT(std::string(status.message()), HasSubstr(part));
  }
}

TEST(ParseRestRepositoryIndex, EmptyBodiesAreFine) {
  for (const char* body : {"", " \n", "{}"}) {
    SCOPED_TRACE(body);
    inference::RepositoryIndexRequest request;
    EXPECT_TRUE(ParseRestRepositoryIndex(body, &request).ok());
    EXPECT_FALSE(request.ready());
  }
}

TEST(ParseRestRepositoryIndex, Ready) {
  inference::RepositoryIndexRequest request;
  ASSERT_TRUE(ParseRestRepositoryIndex(R"({"ready":true})", &request).ok());
  EXPECT_TRUE(request.ready());
  request.Clear();
  ASSERT_TRUE(ParseRestRepositoryIndex(R"( {"ready" : false} )", &request).ok());
  EXPECT_FALSE(request.ready());
}

TEST(ParseRestRepositoryIndex, WrongShapesAreRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"ready":1})", "'ready'"},
      {R"({"ready":"true"})", "'ready'"},
      {R"({"ready":null})", "null"},
      {R"({"ready":{}})", "'ready'"},
      {R"({"ready":[true]})", "'ready'"},
      {R"({"other":true})", "'other'"},
      {R"({"repository_name":"r"})", "'repository_name'"},
      {"[]", ""},
      {"true", ""},
      {"{", "not valid JSON"},
      {R"({"ready":true} x)", "not valid JSON"},
  };
  for (const auto& [body, part] : cases) {
    SCOPED_TRACE(body);
    inference::RepositoryIndexRequest request;
    const absl::Status status = ParseRestRepositoryIndex(body, &request);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_FALSE(status.message().empty());
    EXPECT_THAT(std::string(status.message()), HasSubstr(part));
  }
}

// --- Robustness ------------------------------------------------------------------

TEST(ParseRestInferRequest, DeeplyNestedDataIsRefusedNotACrash) {
  // 2 MiB of '[' inside an input's data (a body well within the server's
  // 256 MiB default limit; ~30,000 levels, 60 KB, already overflow an 8 MiB
  // stack): parsed or refused, not a stack overflow. Run in a child, so that
  // a crash fails this test only.
  EXPECT_EXIT(
      {
        const int depth = 1 << 20;
        const std::string body =
            R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":)" +
            std::string(depth, '[') + "1" + std::string(depth, ']') + "}]}";
        RestInferRequest out;
        const absl::Status status = Parse(body, &out);
        std::fprintf(stderr, "status: %s\n",
                     status.ToString().substr(0, 200).c_str());
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "status");
}

// RapidJSON 1.1.0 lets a lone low surrogate escape (\udc00) through and
// decodes it to bytes that are not UTF-8 (ED B0 80). Whatever the parser
// makes of it, what the server writes back (the error body naming the
// field, the response echoing the id) must be valid JSON, i.e. UTF-8.
TEST(ParseRestInferRequest, LoneSurrogateEscapesNeverMakeInvalidJsonOutput) {
  for (const char* body :
       {R"({"\udc00":1})",
        R"({"inputs":[{"name":"\udfff","datatype":"FP16","shape":[1],"data":[1]}]})"}) {
    SCOPED_TRACE(body);
    RestInferRequest out;
    const absl::Status status = Parse(body, &out);
    ASSERT_FALSE(status.ok());
    rapidjson::Document document;
    const std::string error = RestErrorBody(status);
    document.Parse<rapidjson::kParseValidateEncodingFlag>(error.data(),
                                                          error.size());
    EXPECT_FALSE(document.HasParseError())
        << rapidjson::GetParseError_En(document.GetParseError()) << " in "
        << absl::CEscape(error);
  }
  RestInferRequest out;
  const absl::Status status = Parse(
      R"({"id":"\udc00","inputs":[{"name":"x","datatype":"FP32","shape":[1],)"
      R"("data":[1]}]})",
      &out);
  if (!status.ok()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return;
  }
  RestBody body;
  WriteRestInferResponse(out, Response(out.request.id()), &body);
  rapidjson::Document document;
  document.Parse<rapidjson::kParseValidateEncodingFlag>(body.bytes.data(),
                                                        body.bytes.size());
  EXPECT_FALSE(document.HasParseError())
      << rapidjson::GetParseError_En(document.GetParseError()) << " in "
      << absl::CEscape(body.bytes);
}

TEST(ParseRestInferRequest, DatatypeGivenTwiceNeverMismatchesTheRawSize) {
  // `datatype` again after the data: accepted or refused, but an accepted
  // input's raw contents hold its (final) datatype's size per element.
  RestInferRequest out;
  const absl::Status status = Parse(
      R"({"inputs":[{"name":"x","datatype":"INT8","shape":[2],"data":[1,2],)"
      R"("datatype":"FP32"}]})",
      &out);
  if (!status.ok()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("input 'x'"));
    return;
  }
  ASSERT_EQ(out.request.raw_input_contents_size(), 1);
  const std::string& datatype = out.request.inputs(0).datatype();
  const size_t element_bytes = datatype == "FP32" ? 4 : 1;
  EXPECT_EQ(out.request.raw_input_contents(0).size(), 2 * element_bytes)
      << "accepted as datatype '" << datatype << "' with "
      << out.request.raw_input_contents(0).size() << " raw bytes for 2 elements";
}

}  // namespace
}  // namespace attnserve

// Instruction-set selection: detection follows the CPU, caps lower it, a bad
// cap is a clear error, and every compiled copy of the kernels that this CPU
// can run agrees with the reference within the derived bound. Also run
// under the isa_avx2 and isa_baseline CTest variants, where the variant's
// caps must be the ones in force.
#include "attn/cpu_isa.h"

#include <algorithm>
#include <cstdlib>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "attn/engine.h"
#include "attn/testing/engines.h"
#include "attn/testing/error_bounds.h"
#include "attn/testing/random.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::attn::testing::AttentionBounds;
using ::attn::testing::RandomLengths;
using ::attn::testing::RandomNormal;
using ::attn::testing::ReferenceEngine;
using ::attn::testing::ViewOf;
using ::attn::testing::WithinBounds;

// Sets (or, with nullptr, unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    Set(value);
  }
  ~ScopedEnv() { Set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void Set(const char* value) {
    if (value == nullptr) {
      unsetenv(name_);
    } else {
      setenv(name_, value, 1);
    }
  }
  const char* name_;
  std::optional<std::string> old_;
};

bool CpuHasAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool CpuHasAvx512() {
#if defined(__x86_64__) || defined(__i386__)
  return CpuHasAvx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

// AMX tiles with bfloat16 products in CPUID (the OS's grant is the
// library's to ask for; on these machines Linux gives it).
bool CpuHasAmx() {
#if defined(__x86_64__)
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return CpuHasAvx512() && (edx & (1u << 22)) != 0 && (edx & (1u << 24)) != 0;
#else
  return false;
#endif
}

TEST(CpuIsaTest, NamesRoundTrip) {
  for (CpuIsa isa :
       {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAmx}) {
    auto parsed = ParseCpuIsa(CpuIsaName(isa));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_EQ(ParseCpuIsa("AVX2").value(), CpuIsa::kAvx2);
  EXPECT_EQ(ParseCpuIsa("AVX512").value(), CpuIsa::kAvx512);
  EXPECT_EQ(ParseCpuIsa("AMX").value(), CpuIsa::kAmx);
  auto unknown = ParseCpuIsa("avx9000");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("baseline, avx2, avx512, amx"),
            std::string::npos)
      << unknown.status();
}

TEST(CpuIsaTest, DetectionFollowsTheCpu) {
  const std::vector<CpuIsa> compiled = CompiledCpuIsas();
  ASSERT_FALSE(compiled.empty());
  EXPECT_EQ(compiled.front(), CpuIsa::kBaseline);
#if defined(__x86_64__)
  EXPECT_EQ(compiled, (std::vector<CpuIsa>{CpuIsa::kBaseline, CpuIsa::kAvx2,
                                           CpuIsa::kAvx512, CpuIsa::kAmx}))
      << "x86-64 builds have AVX2 and AVX-512 kernels, and AMX ones";
  EXPECT_EQ(DetectCpuIsa(), CpuHasAmx()      ? CpuIsa::kAmx
                            : CpuHasAvx512() ? CpuIsa::kAvx512
                            : CpuHasAvx2()   ? CpuIsa::kAvx2
                                             : CpuIsa::kBaseline);
#else
  EXPECT_EQ(DetectCpuIsa(), CpuIsa::kBaseline);
#endif
}

TEST(CpuIsaTest, CapsLowerTheChoiceAndNeverRaiseIt) {
  ScopedEnv no_cap(kMaxCpuIsaVariable, nullptr);
  EXPECT_EQ(SelectCpuIsa(std::nullopt).value(), DetectCpuIsa());
  EXPECT_EQ(SelectCpuIsa(CpuIsa::kBaseline).value(), CpuIsa::kBaseline);
  EXPECT_EQ(SelectCpuIsa(CpuIsa::kAmx).value(), DetectCpuIsa());
  EXPECT_EQ(SelectCpuIsa(CpuIsa::kAvx512).value(),
            std::min(DetectCpuIsa(), CpuIsa::kAvx512));
  EXPECT_EQ(SelectCpuIsa(CpuIsa::kAvx2).value(),
            std::min(DetectCpuIsa(), CpuIsa::kAvx2));
  {
    ScopedEnv cap(kMaxCpuIsaVariable, "baseline");
    EXPECT_EQ(SelectCpuIsa(std::nullopt).value(), CpuIsa::kBaseline);
    EXPECT_EQ(SelectCpuIsa(CpuIsa::kAvx2).value(), CpuIsa::kBaseline);
  }
  {
    ScopedEnv empty(kMaxCpuIsaVariable, "");
    EXPECT_EQ(SelectCpuIsa(std::nullopt).value(), DetectCpuIsa());
  }
}

TEST(CpuIsaTest, UnknownEnvironmentCapIsAClearError) {
  ScopedEnv cap(kMaxCpuIsaVariable, "sse9");
  auto isa = SelectCpuIsa(std::nullopt);
  EXPECT_EQ(isa.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(isa.status().message().find("ATTN_MAX_CPU_ISA"), std::string::npos)
      << isa.status();
  auto engine = Engine::Create(EngineOptions{});
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("sse9"), std::string::npos)
      << engine.status();
}

// Under a CTest variant (or a user's own caps), the engines a process makes
// run the capped copy, and oneDNN honours its own cap.
TEST(CpuIsaTest, EnginesRunTheSelectedCopy) {
  auto engine = Engine::Create(EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::string description = (*engine)->backend_descriptions().front();
  const CpuIsa selected = SelectCpuIsa(std::nullopt).value();
  EXPECT_NE(description.find(std::string("own kernels: ") +
                             CpuIsaName(selected)),
            std::string::npos)
      << description;
  // Set by the CTest variants beside their caps (CMakeLists.txt, attn_test).
  const char* expected = std::getenv("ATTN_TEST_EXPECTED_ISA");
  if (expected != nullptr) {
    EXPECT_EQ(CpuIsaName(selected), std::string(expected));
    EXPECT_NE(std::getenv("ONEDNN_MAX_CPU_ISA"), nullptr);
  }
  const char* onednn_cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (onednn_cap != nullptr && *onednn_cap != '\0') {
    const std::string cap = absl::AsciiStrToLower(onednn_cap);
    // Caps every x86-64 CPU of these machines reaches.
    if (cap == "sse41" || (cap == "avx2" && CpuHasAvx2())) {
      EXPECT_NE(description.find("oneDNN: " + cap + ";"), std::string::npos)
          << description;
    }
  }
}

// Each copy this CPU can run (all of them on the AVX2 machines CI runs on),
// side by side in one process: the same contract against the double
// reference.
class EveryCopyTest : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(EveryCopyTest, AttentionWithinDerivedBound) {
  const CpuIsa isa = GetParam();
  EngineOptions options;
  options.max_cpu_isa = isa;
  options.single_thread_below_flops = 0.0;  // the parallel paths too
  auto engine = Engine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::string description = (*engine)->backend_descriptions().front();
  const CpuIsa selected = SelectCpuIsa(isa).value();
  EXPECT_NE(description.find(std::string("own kernels: ") +
                             CpuIsaName(selected)),
            std::string::npos)
      << description;

  std::mt19937 rng(21);
  const Tensor q = RandomNormal(rng, {3, 2, 70, 40});
  const Tensor k = RandomNormal(rng, {3, 2, 300, 40});
  const Tensor v = RandomNormal(rng, {3, 2, 300, 24});
  const std::vector<int32_t> lengths = RandomLengths(rng, 3 * 70, 0, 300);
  for (ScoreKind score : {ScoreKind::kDotProduct, ScoreKind::kGaussian}) {
    AttentionRequest request;
    request.queries = q.view();
    request.keys = k.view();
    request.values = v.view();
    request.valid_lens = ViewOf(lengths, {3, 70});
    request.score = score;
    request.return_weights = true;
    auto expected = ReferenceEngine().ScaledDotProductAttention(request);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const auto bounds = AttentionBounds(request, *expected);
    auto with_weights = (*engine)->ScaledDotProductAttention(request);
    ASSERT_TRUE(with_weights.ok()) << with_weights.status();
    EXPECT_TRUE(WithinBounds(with_weights->weights, expected->weights,
                             bounds.weights));
    EXPECT_TRUE(WithinBounds(with_weights->output, expected->output,
                             bounds.output));
    request.return_weights = false;
    auto fused = (*engine)->ScaledDotProductAttention(request);
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_TRUE(WithinBounds(fused->output, expected->output, bounds.output));
  }
}

std::vector<CpuIsa> CopiesThisCpuRuns() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : CompiledCpuIsas()) {
    if (isa <= DetectCpuIsa()) isas.push_back(isa);
  }
  return isas;
}

INSTANTIATE_TEST_SUITE_P(Copies, EveryCopyTest,
                         ::testing::ValuesIn(CopiesThisCpuRuns()),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(CpuIsaName(info.param));
                         });

}  // namespace
}  // namespace attn

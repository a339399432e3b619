#include "client/load_report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace attnctl {
namespace {

double Millis(int64_t nanos) { return static_cast<double>(nanos) / 1e6; }

// A JSON number: at most 6 significant digits; null when not finite.
std::string JsonNumber(double value) {
  if (!std::isfinite(value)) return "null";
  return absl::StrFormat("%.6g", value);
}

// A JSON string literal: quotes, backslashes and control characters escaped.
std::string JsonString(absl::string_view text) {
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      quoted += '\\';
      quoted += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&quoted, "\\u%04x", static_cast<int>(c));
    } else {
      quoted += c;
    }
  }
  quoted += '"';
  return quoted;
}

std::string JsonLatency(const std::optional<LatencySummary>& latency) {
  if (!latency.has_value()) return "null";
  return absl::StrFormat(
      R"({"p50": %s, "p90": %s, "p99": %s, "p999": %s, "max": %s, )"
      R"("mean": %s})",
      JsonNumber(latency->p50_ms), JsonNumber(latency->p90_ms),
      JsonNumber(latency->p99_ms), JsonNumber(latency->p999_ms),
      JsonNumber(latency->max_ms), JsonNumber(latency->mean_ms));
}

std::string Plural(int64_t count, absl::string_view noun) {
  return absl::StrCat(count, " ", noun, count == 1 ? "" : "s");
}

}  // namespace

int64_t Percentile(const std::vector<int64_t>& sorted, double p) {
  const double n = static_cast<double>(sorted.size());
  const int64_t rank = static_cast<int64_t>(std::ceil(p / 100.0 * n - 1e-6));
  const int64_t index =
      std::clamp<int64_t>(rank - 1, 0, static_cast<int64_t>(sorted.size()) - 1);
  return sorted[index];
}

std::optional<LatencySummary> SummarizeLatencies(std::vector<int64_t> nanos) {
  if (nanos.empty()) return std::nullopt;
  std::sort(nanos.begin(), nanos.end());
  LatencySummary summary;
  summary.p50_ms = Millis(Percentile(nanos, 50));
  summary.p90_ms = Millis(Percentile(nanos, 90));
  summary.p99_ms = Millis(Percentile(nanos, 99));
  summary.p999_ms = Millis(Percentile(nanos, 99.9));
  summary.max_ms = Millis(nanos.back());
  long double sum = 0;
  for (int64_t value : nanos) sum += value;
  summary.mean_ms = Millis(static_cast<int64_t>(sum / nanos.size()));
  return summary;
}

std::string FormatReportText(const Report& report) {
  std::string text;
  const std::string threads = Plural(report.client_threads, "client thread");
  if (report.open_loop) {
    absl::StrAppendFormat(&text,
                          "load        %s, open loop: %s req/s Poisson, at "
                          "most %d in flight, %s\n",
                          report.rpc, JsonNumber(report.target_rate),
                          report.max_in_flight, threads);
  } else {
    absl::StrAppendFormat(&text,
                          "load        %s, closed loop: %d in flight, %s\n",
                          report.rpc, report.concurrency, threads);
  }
  absl::StrAppendFormat(&text, "pool        %s",
                        Plural(report.pool_size, "distinct request"));
  if (report.variant_counts.size() > 1) {
    absl::StrAppendFormat(&text, " (per --mix variant: %s)",
                          absl::StrJoin(report.variant_counts, ", "));
  }
  text += "\n";
  absl::StrAppendFormat(&text, "window      %.3f s after %s s of warm-up\n",
                        report.duration_s, JsonNumber(report.warmup_s));
  absl::StrAppendFormat(&text, "requests    %d completed: %d ok, %d failed\n",
                        report.requests, report.ok,
                        report.requests - report.ok);
  absl::StrAppendFormat(&text, "throughput  %.1f req/s ok\n",
                        report.throughput_rps);
  if (report.open_loop) {
    absl::StrAppendFormat(
        &text, "rate        %.1f req/s sent of %s target; %d dropped at the cap\n",
        report.achieved_rate_rps, JsonNumber(report.target_rate),
        report.dropped);
  }
  if (report.latency.has_value()) {
    const LatencySummary& l = *report.latency;
    absl::StrAppendFormat(&text,
                          "latency ms  p50 %.3f  p90 %.3f  p99 %.3f  p99.9 "
                          "%.3f  max %.3f  mean %.3f%s\n",
                          l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms,
                          l.mean_ms,
                          report.open_loop ? "  (from scheduled arrival)" : "");
  } else {
    text += "latency ms  none: no request succeeded\n";
  }
  if (report.send_lag.has_value()) {
    absl::StrAppendFormat(&text,
                          "send lag ms p50 %.3f  p99 %.3f  max %.3f  (sent "
                          "after the scheduled arrival)\n",
                          report.send_lag->p50_ms, report.send_lag->p99_ms,
                          report.send_lag->max_ms);
  }
  if (!report.errors.empty()) {
    std::vector<std::string> errors;
    for (const auto& [code, count] : report.errors) {
      errors.push_back(absl::StrCat(code, " ", count));
    }
    absl::StrAppendFormat(&text, "errors      %s\n",
                          absl::StrJoin(errors, ", "));
  }
  if (report.retried > 0) {
    absl::StrAppendFormat(&text, "retried     %d resends after UNAVAILABLE\n",
                          report.retried);
  }
  if (!report.first_error.empty()) {
    absl::StrAppendFormat(&text, "first error %s\n", report.first_error);
  }
  return text;
}

std::string FormatReportJson(const Report& report) {
  std::string json = absl::StrFormat(R"({"rpc": "%s", "mode": "%s", )",
                                     report.rpc,
                                     report.open_loop ? "open" : "closed");
  if (report.open_loop) {
    absl::StrAppendFormat(&json, R"("target_rate": %s, "max_in_flight": %d, )",
                          JsonNumber(report.target_rate), report.max_in_flight);
  } else {
    absl::StrAppendFormat(&json, R"("concurrency": %d, )", report.concurrency);
  }
  absl::StrAppendFormat(
      &json,
      R"("client_threads": %d, "pool_size": %d, "warmup_s": %s, )"
      R"("duration_s": %s, "requests": %d, "ok": %d, "throughput_rps": %s, )",
      report.client_threads, report.pool_size, JsonNumber(report.warmup_s),
      JsonNumber(report.duration_s), report.requests, report.ok,
      JsonNumber(report.throughput_rps));
  if (report.open_loop) {
    absl::StrAppendFormat(&json, R"("achieved_rate_rps": %s, )",
                          JsonNumber(report.achieved_rate_rps));
  }
  absl::StrAppendFormat(&json, R"("latency_ms": %s, )",
                        JsonLatency(report.latency));
  if (report.open_loop) {
    absl::StrAppendFormat(&json, R"("send_lag_ms": %s, )",
                          JsonLatency(report.send_lag));
  }
  std::vector<std::string> errors;
  for (const auto& [code, count] : report.errors) {
    errors.push_back(absl::StrFormat(R"("%s": %d)", code, count));
  }
  absl::StrAppendFormat(&json,
                        R"("errors": {%s}, "dropped": %d, "retried": %d)",
                        absl::StrJoin(errors, ", "), report.dropped,
                        report.retried);
  if (!report.first_error.empty()) {
    absl::StrAppendFormat(&json, R"(, "first_error": %s)",
                          JsonString(report.first_error));
  }
  json += "}";
  return json;
}

}  // namespace attnctl

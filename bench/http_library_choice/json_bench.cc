// JSON half of the KServe v2 HTTP library choice (see README.md).
//
// Parses a KServe v2 infer request with one FP32 input of 64*64*64 = 262144
// numbers in "data" into a std::vector<float> with each candidate, and
// writes the same floats as a JSON array with each candidate writer.
// Reports MB/s and ns per number (the better of two rounds, each the median
// of kReps runs) and whether every float comes back bit-exactly.
//
// Bodies (all 262144 numbers, built with std::to_chars):
//   "short"  normal(0,1) float32 values, shortest round-trip float text
//            (what std::to_chars(float) or numpy's repr of float32 prints),
//            e.g. -0.8326987
//   "py64"   the same values as Python's json.dumps(arr.tolist()) writes
//            them: shortest text of the float64 holding the float32,
//            e.g. -0.8326987028121948
//   "full"   random finite float32 bit patterns over the whole range
//            (subnormals, 1e-38..3e38 exponents) plus edge values
//            (-0, denorm_min, FLT_MIN, FLT_MAX, ...), shortest float text;
//            the exactness check
//
// Build: g++ -O2 -std=c++17 json_bench.cc -lsimdjson
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>
#include <algorithm>
#include <chrono>
#include <functional>

#include <nlohmann/json.hpp>
#include <rapidjson/document.h>
#include <rapidjson/reader.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <simdjson.h>

namespace {

constexpr size_t kCount = 64 * 64 * 64;
constexpr int kReps = 7;
constexpr int kRounds = 2;

uint32_t Bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

std::vector<float> NormalValues() {
  std::mt19937_64 rng(42);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<float> v(kCount);
  for (auto& x : v) x = static_cast<float>(nd(rng));
  return v;
}

std::vector<float> FullRangeValues() {
  std::mt19937_64 rng(7);
  std::vector<float> v;
  v.reserve(kCount);
  const float edge[] = {0.0f,
                        -0.0f,
                        std::numeric_limits<float>::denorm_min(),
                        -std::numeric_limits<float>::denorm_min(),
                        std::nextafter(std::numeric_limits<float>::min(), 0.0f),
                        std::numeric_limits<float>::min(),
                        std::numeric_limits<float>::max(),
                        -std::numeric_limits<float>::max(),
                        1.0f,
                        0.1f,
                        16777217.0f,
                        3.4028234e38f,
                        1e-45f,
                        7.038531e-26f,
                        8.589973e9f};
  for (float f : edge) v.push_back(f);
  while (v.size() < kCount) {
    uint32_t u = static_cast<uint32_t>(rng());
    float f;
    memcpy(&f, &u, 4);
    if (std::isfinite(f)) v.push_back(f);
  }
  return v;
}

// {"inputs":[{"name":"INPUT0","shape":[64,64,64],"datatype":"FP32","data":[...]}]}
std::string MakeBody(const std::vector<float>& v, bool as_double) {
  std::string s =
      "{\"inputs\":[{\"name\":\"INPUT0\",\"shape\":[64,64,64],"
      "\"datatype\":\"FP32\",\"data\":[";
  char buf[64];
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    auto r = as_double ? std::to_chars(buf, buf + sizeof buf, double{v[i]})
                       : std::to_chars(buf, buf + sizeof buf, v[i]);
    s.append(buf, r.ptr);
  }
  s += "]}]}";
  return s;
}

// ---- parsers: body -> floats of inputs[0].data; false on any error ----

// (a) RapidJSON SAX, numbers as raw strings, std::from_chars<float>.
struct InferSax
    : rapidjson::BaseReaderHandler<rapidjson::UTF8<>, InferSax> {
  std::vector<float>* out;
  int depth = 0, data_depth = 0;
  bool next_is_data = false;
  bool Default() {
    next_is_data = false;
    return true;
  }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    next_is_data = (n == 4 && memcmp(s, "data", 4) == 0);
    return true;
  }
  bool StartObject() {
    ++depth;
    next_is_data = false;
    return true;
  }
  bool EndObject(rapidjson::SizeType) {
    --depth;
    return true;
  }
  bool StartArray() {
    ++depth;
    if (next_is_data) data_depth = depth, next_is_data = false;
    return true;
  }
  bool EndArray(rapidjson::SizeType) {
    if (depth == data_depth) data_depth = 0;
    --depth;
    return true;
  }
  bool RawNumber(const char* s, rapidjson::SizeType n, bool) {
    next_is_data = false;
    if (data_depth == 0) return true;
    float f;
    auto r = std::from_chars(s, s + n, f);
    // libstdc++ 12 answers result_out_of_range (and leaves f unset) for text
    // that overflows or underflows to 0 (e.g. 1e-46); shortest float text
    // never does, so here that is an error.
    if (r.ec != std::errc() || r.ptr != s + n) return false;
    out->push_back(f);
    return true;
  }
};

bool RapidSaxFromChars(const std::string& body, std::vector<float>& out) {
  out.clear();
  out.reserve(kCount);
  InferSax h;
  h.out = &out;
  rapidjson::Reader reader;
  rapidjson::StringStream ss(body.c_str());
  return !reader.Parse<rapidjson::kParseNumbersAsStringsFlag>(ss, h).IsError();
}

// (a2) the same handler, in-situ: RapidJSON then hands RawNumber a pointer
// into the (copied, mutable) body instead of pushing each digit onto its
// stack. The copy is inside the timed region.
bool RapidSaxInsituFromChars(const std::string& body, std::vector<float>& out) {
  out.clear();
  out.reserve(kCount);
  InferSax h;
  h.out = &out;
  rapidjson::Reader reader;
  std::string buf(body);
  rapidjson::InsituStringStream ss(buf.data());
  return !reader
              .Parse<rapidjson::kParseNumbersAsStringsFlag |
                     rapidjson::kParseInsituFlag>(ss, h)
              .IsError();
}

template <unsigned kFlags>
bool RapidDom(const std::string& body, std::vector<float>& out) {
  out.clear();
  rapidjson::Document d;
  d.Parse<kFlags>(body.data(), body.size());
  if (d.HasParseError() || !d.IsObject()) return false;
  auto in = d.FindMember("inputs");
  if (in == d.MemberEnd() || !in->value.IsArray() || in->value.Empty())
    return false;
  const auto& in0 = in->value[0];
  auto data = in0.FindMember("data");
  if (data == in0.MemberEnd() || !data->value.IsArray()) return false;
  out.reserve(data->value.Size());
  for (const auto& x : data->value.GetArray()) {
    if (!x.IsNumber()) return false;
    out.push_back(static_cast<float>(x.GetDouble()));
  }
  return true;
}

simdjson::ondemand::parser& SjParser() {
  static simdjson::ondemand::parser p;
  return p;
}

// (c) simdjson On-Demand; raw=false: get_double then (float); raw=true: the
// raw number token to std::from_chars<float> (is_number checked first).
// The body is copied into a padded_string inside the timed region, as a
// server holding the body in a std::string would have to.
template <bool kRaw>
bool SimdjsonOnDemand(const std::string& body, std::vector<float>& out) {
  using namespace simdjson;
  out.clear();
  out.reserve(kCount);
  padded_string ps(body);
  ondemand::document doc;
  if (SjParser().iterate(ps).get(doc)) return false;
  ondemand::array inputs;
  if (doc["inputs"].get_array().get(inputs)) return false;
  for (auto in_r : inputs) {
    ondemand::object in0;
    if (in_r.get_object().get(in0)) return false;
    ondemand::array data;
    if (in0.find_field_unordered("data").get_array().get(data)) return false;
    for (auto vr : data) {
      ondemand::value v;
      if (vr.get(v)) return false;
      if constexpr (kRaw) {
        ondemand::json_type t;
        if (v.type().get(t) || t != ondemand::json_type::number) return false;
        std::string_view tok = v.raw_json_token();
        float f;
        auto r = std::from_chars(tok.data(), tok.data() + tok.size(), f);
        if (r.ec != std::errc()) return false;
        // the token may carry trailing white space, nothing else
        for (const char* p = r.ptr; p != tok.data() + tok.size(); ++p)
          if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') return false;
        out.push_back(f);
      } else {
        double d;
        if (v.get_double().get(d)) return false;
        out.push_back(static_cast<float>(d));
      }
    }
    break;  // inputs[0] only
  }
  return true;
}

bool Nlohmann(const std::string& body, std::vector<float>& out) {
  out.clear();
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return false;
  auto in = j.find("inputs");
  if (in == j.end() || !in->is_array() || in->empty()) return false;
  auto data = (*in)[0].find("data");
  if (data == (*in)[0].end() || !data->is_array()) return false;
  out.reserve(data->size());
  for (const auto& x : *data) {
    if (!x.is_number()) return false;
    out.push_back(x.get<float>());
  }
  return true;
}

// ---- writers: floats -> JSON array text ----

void WriteToChars(const std::vector<float>& v, std::string& s) {
  s.clear();
  s.reserve(v.size() * 16 + 2);
  s += '[';
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    auto r = std::to_chars(buf, buf + sizeof buf, v[i]);
    s.append(buf, r.ptr);
  }
  s += ']';
}

void WriteRapid(const std::vector<float>& v, std::string& s) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  w.StartArray();
  for (float f : v) w.Double(f);
  w.EndArray();
  s.assign(sb.GetString(), sb.GetSize());
}

void WriteSnprintf9g(const std::vector<float>& v, std::string& s) {
  s.clear();
  s.reserve(v.size() * 16 + 2);
  s += '[';
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    int n = snprintf(buf, sizeof buf, "%.9g", v[i]);
    s.append(buf, n);
  }
  s += ']';
}

// Reads a JSON array of numbers back exactly (from_chars<float>).
bool ReadBack(const std::string& s, std::vector<float>& out) {
  out.clear();
  const char* p = s.data() + 1;
  const char* end = s.data() + s.size() - 1;
  while (p < end) {
    float f;
    auto r = std::from_chars(p, end, f);
    if (r.ec != std::errc()) return false;
    out.push_back(f);
    p = r.ptr;
    if (p < end && *p == ',') ++p;
  }
  return true;
}

double Seconds(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

// median of kReps runs
double Median(const std::function<void()>& f) {
  std::vector<double> t;
  for (int i = 0; i < kReps; ++i) t.push_back(Seconds(f));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Mismatch {
  size_t count = 0;
  std::string example;
};

Mismatch Compare(const std::vector<float>& want, const std::vector<float>& got) {
  Mismatch m;
  if (want.size() != got.size()) {
    m.count = std::max(want.size(), got.size());
    m.example = "size " + std::to_string(got.size()) + " != " +
                std::to_string(want.size());
    return m;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (Bits(want[i]) != Bits(got[i])) {
      if (m.count++ < 3) {
        char buf[160];
        char txt[32];
        *std::to_chars(txt, txt + sizeof txt, want[i]).ptr = 0;
        snprintf(buf, sizeof buf, "%s\"%s\" -> %a (want %a)",
                 m.example.empty() ? "" : "; ", txt,
                 static_cast<double>(got[i]), static_cast<double>(want[i]));
        m.example += buf;
      }
    }
  }
  return m;
}

using Parser = bool (*)(const std::string&, std::vector<float>&);

}  // namespace

int main() {
  printf("simdjson %s: stage 1 runtime-dispatched to '%s' (%s)\n",
         SIMDJSON_STRINGIFY(SIMDJSON_VERSION), simdjson::get_active_implementation()->name().c_str(),
         simdjson::get_active_implementation()->description().c_str());
  printf("RapidJSON %s, nlohmann-json %d.%d.%d, g++ %d.%d, libstdc++ %d\n\n",
         RAPIDJSON_VERSION_STRING, NLOHMANN_JSON_VERSION_MAJOR,
         NLOHMANN_JSON_VERSION_MINOR, NLOHMANN_JSON_VERSION_PATCH, __GNUC__,
         __GNUC_MINOR__, _GLIBCXX_RELEASE);

  const std::vector<float> normal = NormalValues();
  const std::vector<float> full = FullRangeValues();
  struct Body {
    const char* name;
    const std::vector<float>* vals;
    std::string text;
  };
  Body bodies[] = {{"short", &normal, MakeBody(normal, false)},
                   {"py64", &normal, MakeBody(normal, true)},
                   {"full", &full, MakeBody(full, false)}};
  for (const auto& b : bodies)
    printf("body %-5s %8zu bytes (%.2f MB), %zu numbers\n", b.name,
           b.text.size(), b.text.size() / 1e6, kCount);
  printf("\n");

  struct Candidate {
    const char* name;
    Parser parse;
  };
  const Candidate parsers[] = {
      {"(a) RapidJSON SAX NumbersAsStrings + from_chars<float>",
       RapidSaxFromChars},
      {"(a2) RapidJSON SAX as (a) + kParseInsituFlag",
       RapidSaxInsituFromChars},
      {"(b) RapidJSON DOM FullPrecision, double->float",
       RapidDom<rapidjson::kParseFullPrecisionFlag>},
      {"(b') RapidJSON DOM default flags, double->float",
       RapidDom<rapidjson::kParseDefaultFlags>},
      {"(c) simdjson On-Demand get_double, double->float",
       SimdjsonOnDemand<false>},
      {"(c') simdjson On-Demand raw token + from_chars<float>",
       SimdjsonOnDemand<true>},
      {"(d) nlohmann-json DOM, get<float>", Nlohmann},
  };

  printf("PARSE (MB/s and ns/number: better of %d rounds, each the median of %d"
         " runs)\n",
         kRounds, kReps);
  printf("| %-54s | %-24s | %-24s | %-34s |\n", "parser",
         "short: MB/s, ns/number", "py64: MB/s, ns/number",
         "bit-exact? (short / py64 / full)");
  printf("|%s|%s|%s|%s|\n", std::string(56, '-').c_str(),
         std::string(26, '-').c_str(), std::string(26, '-').c_str(),
         std::string(36, '-').c_str());
  std::vector<std::string> notes;
  for (const auto& c : parsers) {
    double best[2] = {1e9, 1e9};
    std::string exact;
    for (int bi = 0; bi < 3; ++bi) {
      const Body& b = bodies[bi];
      std::vector<float> out;
      bool ok = c.parse(b.text, out);
      Mismatch m = ok ? Compare(*b.vals, out) : Mismatch{1, "parse failed"};
      if (bi) exact += " / ";
      exact += m.count == 0 ? "yes" : (std::to_string(m.count) + " wrong");
      if (m.count)
        notes.push_back(std::string(c.name) + ", body " + b.name + ": " +
                        std::to_string(m.count) + " of " +
                        std::to_string(kCount) + " differ, " + m.example);
      if (bi < 2) {
        for (int r = 0; r < kRounds; ++r)
          best[bi] = std::min(best[bi], Median([&] { c.parse(b.text, out); }));
      }
    }
    char cell[2][64];
    for (int bi = 0; bi < 2; ++bi)
      snprintf(cell[bi], sizeof cell[bi], "%7.0f MB/s, %5.1f ns",
               bodies[bi].text.size() / best[bi] / 1e6, best[bi] / kCount * 1e9);
    printf("| %-54s | %-24s | %-24s | %-34s |\n", c.name, cell[0], cell[1],
           exact.c_str());
    fflush(stdout);
  }
  for (const auto& n : notes) printf("  note: %s\n", n.c_str());

  // Malformed or out-of-range numbers: what each parser lets through.
  {
    const char* cases[] = {"-nan", "-inf", "1e39", "01", "1.", "1e-50", "-0"};
    printf("\nODD NUMBERS in \"data\" (value stored, or 'rejected')\n| %-54s |",
           "parser");
    for (const char* c : cases) printf(" %-10s |", c);
    printf("\n|%s|", std::string(56, '-').c_str());
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i)
      printf("%s|", std::string(12, '-').c_str());
    printf("\n");
    for (const auto& c : parsers) {
      printf("| %-54s |", c.name);
      for (const char* num : cases) {
        std::string body =
            std::string("{\"inputs\":[{\"name\":\"x\",\"shape\":[1],"
                        "\"datatype\":\"FP32\",\"data\":[") +
            num + "]}]}";
        std::vector<float> out;
        char cell[32] = "rejected";
        if (c.parse(body, out) && out.size() == 1)
          snprintf(cell, sizeof cell, "%g", static_cast<double>(out[0]));
        printf(" %-10s |", cell);
      }
      printf("\n");
    }
  }

  // How often does correctly-rounded text->double->float differ from
  // text->float (double rounding) on shortest float text?
  {
    std::mt19937_64 rng(99);
    size_t n = 0, bad = 0;
    std::string first;
    char buf[32];
    while (n < (size_t{1} << 24)) {
      uint32_t u = static_cast<uint32_t>(rng());
      float f;
      memcpy(&f, &u, 4);
      if (!std::isfinite(f)) continue;
      ++n;
      auto e = std::to_chars(buf, buf + sizeof buf, f).ptr;
      double d;
      std::from_chars(buf, e, d);
      if (Bits(static_cast<float>(d)) != Bits(f) && bad++ == 0)
        first.assign(buf, e);
    }
    printf("\nDOUBLE ROUNDING: %zu of %zu random finite floats' shortest text "
           "parse to the wrong float via correctly-rounded double%s%s\n",
           bad, n, bad ? ", e.g. " : "", first.c_str());
  }

  printf("\nWRITE 262144 floats as a JSON array (better of %d medians of %d)\n",
         kRounds, kReps);
  printf("| %-44s | %-13s | %-22s | %-26s |\n", "writer", "bytes (short)",
         "MB/s, ns/number", "round-trips? (short/full)");
  printf("|%s|%s|%s|%s|\n", std::string(46, '-').c_str(),
         std::string(15, '-').c_str(), std::string(24, '-').c_str(),
         std::string(28, '-').c_str());
  struct Writer {
    const char* name;
    void (*write)(const std::vector<float>&, std::string&);
  };
  const Writer writers[] = {
      {"std::to_chars(float) shortest", WriteToChars},
      {"RapidJSON Writer::Double((double)f)", WriteRapid},
      {"snprintf %.9g", WriteSnprintf9g},
  };
  notes.clear();
  for (const auto& w : writers) {
    std::string s, exact;
    std::vector<float> back;
    const std::vector<float>* sets[] = {&normal, &full};
    for (int si = 0; si < 2; ++si) {
      w.write(*sets[si], s);
      bool ok = ReadBack(s, back);
      Mismatch m = ok ? Compare(*sets[si], back) : Mismatch{1, "read failed"};
      if (si) exact += " / ";
      exact += m.count == 0 ? "yes" : (std::to_string(m.count) + " wrong");
      if (m.count)
        notes.push_back(std::string(w.name) + ": " + m.example);
    }
    double best = 1e9;
    for (int r = 0; r < kRounds; ++r)
      best = std::min(best, Median([&] { w.write(normal, s); }));
    w.write(normal, s);
    char cell[64];
    snprintf(cell, sizeof cell, "%6.0f MB/s, %5.1f ns", s.size() / best / 1e6,
             best / kCount * 1e9);
    printf("| %-44s | %13zu | %-22s | %-26s |\n", w.name, s.size(), cell,
           exact.c_str());
    fflush(stdout);
  }
  for (const auto& n : notes) printf("  note: %s\n", n.c_str());
  return 0;
}

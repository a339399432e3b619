// What the KServe REST codec's readers share (server/kserve/rest.h): the
// in-situ JSON parse of a body with RapidJSON's SAX reader, its cursor (ours,
// so that the inference handler may read a data array's numbers itself), a
// check for UTF-16 surrogates left in decoded text, and the one reading of a
// JSON number as a double. Internal to server/kserve/rest_*.cc.
//
// Pure functions over the caller's objects; thread-compatible.
#ifndef ATTNSERVE_SERVER_KSERVE_REST_JSON_H_
#define ATTNSERVE_SERVER_KSERVE_REST_JSON_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "rapidjson/error/en.h"
#include "rapidjson/reader.h"

namespace attnserve {

// RapidJSON's in-situ stream (its InsituStringStream's members and
// methods), ours so that the inference handler may read a data array's
// numbers itself and move the parse past them. `limit` is the end of the
// text's buffer (its NULs included).
struct InsituCursor {
  typedef char Ch;
  InsituCursor(char* text, char* limit)
      : src_(text), dst_(nullptr), head_(text), limit_(limit) {}
  char Peek() const { return *src_; }
  char Take() { return *src_++; }
  size_t Tell() const { return static_cast<size_t>(src_ - head_); }
  void Put(char c) { *dst_++ = c; }
  char* PutBegin() { return dst_ = src_; }
  size_t PutEnd(char* begin) { return static_cast<size_t>(dst_ - begin); }
  void Flush() {}
  char* Push(size_t count) {
    char* begin = dst_;
    dst_ += count;
    return begin;
  }
  void Pop(size_t count) { dst_ -= count; }

  char* src_;
  char* dst_;
  char* head_;
  char* limit_;
};

}  // namespace attnserve

namespace rapidjson {
// Copied into locals while RapidJSON scans a string or number, as its own
// in-situ stream is: no handler callback moves it then.
template <>
struct StreamTraits<attnserve::InsituCursor> {
  enum { copyOptimization = 1 };
};
}  // namespace rapidjson

namespace attnserve {

// Whether decoded text holds a UTF-16 surrogate (ED A0..BF in UTF-8):
// RapidJSON 1.1 decodes a lone low-surrogate escape (\udc00) into one, which
// is not UTF-8 and would make every echo of the text invalid JSON.
bool HasSurrogate(const char* text, size_t length);


// A whole JSON number as the nearest double, beyond double's range too
// (then +-inf, or +-0 and subnormals below it, signed: std::from_chars
// refuses those with result_out_of_range and leaves its value unset, so
// strtod rounds them; the server's locale is "C"). nullopt when `text` is
// not a number.
std::optional<double> ParseDouble(absl::string_view text);


// Parses `body` in place in a null-terminated copy (RapidJSON's insitu
// mode: strings and numbers are handed over as pointers into it, not
// copied; twice as fast on large `data` as a MemoryStream:
// bench/http_library_choice/). The copy keeps the parse inside the JSON
// header whatever the bytes.
template <typename Handler>
absl::Status ParseJson(absl::string_view body, Handler* handler,
                       absl::string_view what) {
  // Four NULs after the text: a multi-byte UTF-8 lead at the very end has
  // its continuation bytes read (and refused) inside the copy, not past it
  // (the fuzzer's heap overflow with one NUL). The data fast path's scans
  // stop at the first.
  std::string text;
  text.reserve(body.size() + 4);
  text.append(body.data(), body.size());
  text.append(4, '\0');
  InsituCursor stream(text.data(), text.data() + text.size());
  handler->Attach(&stream);
  rapidjson::Reader reader;
  rapidjson::ParseResult result =
      reader.Parse<rapidjson::kParseInsituFlag | rapidjson::kParseIterativeFlag |
                   rapidjson::kParseNumbersAsStringsFlag |
                   rapidjson::kParseStopWhenDoneFlag |
                   rapidjson::kParseValidateEncodingFlag>(stream, *handler);
  if (!result) {
    if (!handler->error().empty()) {
      return absl::InvalidArgumentError(handler->error());
    }
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is not valid JSON: ",
        rapidjson::GetParseError_En(result.Code()), " at byte ",
        result.Offset()));
  }
  // Only whitespace may follow the object (a NUL inside the header would
  // have ended the copy's parse early: refused here too).
  for (size_t i = stream.Tell(); i < body.size(); ++i) {
    const char c = body[i];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " is not valid JSON: more after the object, at byte ", i));
    }
  }
  return absl::OkStatus();
}

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_KSERVE_REST_JSON_H_

// The REST bodies of the model repository extension (server/kserve/rest.h):
// the index request's {"ready": bool}, and a load or unload's parameters.
#include "server/kserve/rest.h"

#include <charconv>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "server/kserve/rest_json.h"

namespace attnserve {
namespace {

// Parses a small JSON object body into a rapidjson-free handler of
// key -> scalar, for the repository's bodies. Accepts an empty body.
template <typename OnScalar>
class FlatObjectHandler
    : public rapidjson::BaseReaderHandler<rapidjson::UTF8<>,
                                          FlatObjectHandler<OnScalar>> {
 public:
  explicit FlatObjectHandler(OnScalar on_scalar, absl::string_view nested)
      : on_scalar_(std::move(on_scalar)), nested_(nested) {}
  bool Default() { return Fail("a value of the wrong type"); }
  bool Null() { return Fail("null is not allowed"); }
  bool Bool(bool value) { return Scalar(value ? "true" : "false", 'b'); }
  bool RawNumber(const char* text, rapidjson::SizeType length, bool) {
    return Scalar(std::string(text, length), 'n');
  }
  bool String(const char* text, rapidjson::SizeType length, bool) {
    if (HasSurrogate(text, length)) {
      return Fail("a \\u escape of a lone surrogate");
    }
    return Scalar(std::string(text, length), 's');
  }
  bool Key(const char* text, rapidjson::SizeType length, bool) {
    if (HasSurrogate(text, length)) {
      return Fail("a field name with a \\u escape of a lone surrogate");
    }
    key_.assign(text, length);
    return true;
  }
  bool StartObject() {
    if (depth_ == 0 || (depth_ == 1 && !nested_.empty() && key_ == nested_)) {
      ++depth_;
      return true;
    }
    return Fail(absl::StrCat("field '", key_, "': an object is not allowed"));
  }
  bool EndObject(rapidjson::SizeType) {
    --depth_;
    return true;
  }
  bool StartArray() {
    return Fail(absl::StrCat("field '", key_, "': an array is not allowed"));
  }
  void Attach(InsituCursor*) {}
  const std::string& error() const { return error_; }

 private:
  bool Scalar(const std::string& text, char kind) {
    std::string error = on_scalar_(depth_, key_, text, kind);
    if (!error.empty()) return Fail(std::move(error));
    return true;
  }
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  OnScalar on_scalar_;
  const std::string nested_;
  int depth_ = 0;
  std::string key_;
  std::string error_;
};

}  // namespace

absl::Status ParseRestRepositoryParameters(
    absl::string_view body,
    google::protobuf::Map<std::string, inference::ModelRepositoryParameter>*
        parameters) {
  if (body.find_first_not_of(" \t\r\n") == absl::string_view::npos) {
    return absl::OkStatus();
  }
  auto on_scalar = [parameters](int depth, const std::string& key,
                                const std::string& text,
                                char kind) -> std::string {
    if (depth != 2) {
      return absl::StrCat("field '", key,
                          "': the body's only field is 'parameters'");
    }
    inference::ModelRepositoryParameter& parameter = (*parameters)[key];
    if (kind == 'b') {
      parameter.set_bool_param(text == "true");
    } else if (kind == 's') {
      parameter.set_string_param(text);
    } else {
      int64_t value = 0;
      auto [end, error] =
          std::from_chars(text.data(), text.data() + text.size(), value);
      if (error != std::errc() || end != text.data() + text.size()) {
        return absl::StrCat("parameter '", key, "': must be an integer");
      }
      parameter.set_int64_param(value);
    }
    return {};
  };
  FlatObjectHandler<decltype(on_scalar)> handler(on_scalar, "parameters");
  return ParseJson(body, &handler, "the request body");
}

absl::Status ParseRestRepositoryIndex(absl::string_view body,
                                      inference::RepositoryIndexRequest* request) {
  if (body.find_first_not_of(" \t\r\n") == absl::string_view::npos) {
    return absl::OkStatus();
  }
  auto on_scalar = [request](int depth, const std::string& key,
                             const std::string& text,
                             char kind) -> std::string {
    if (depth == 1 && key == "ready" && kind == 'b') {
      request->set_ready(text == "true");
      return {};
    }
    return absl::StrCat("field '", key,
                        "': the body's only field is 'ready' (true or false)");
  };
  FlatObjectHandler<decltype(on_scalar)> handler(on_scalar, "");
  return ParseJson(body, &handler, "the request body");
}

}  // namespace attnserve

#include "client/requests.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/tensors.h"

namespace attnctl {
namespace {

using attention::v1::AdditiveAttentionRequest;
using attention::v1::AppendMemoryRequest;
using attention::v1::AttentionRequest;
using attention::v1::BatchMatmulRequest;
using attention::v1::FitBandwidthRequest;
using attention::v1::Lengths;
using attention::v1::MaskedSoftmaxRequest;
using attention::v1::NadarayaWatsonRequest;
using attention::v1::Tensor;

constexpr int kMaxRank = 8;
// The textbook's sizes: 50 training points, hidden width 8.
constexpr int64_t kTextbookPoints = 50;
constexpr int64_t kTextbookHidden = 8;
// x_train ~ U[0, kTextbookRange); x_query evenly spaced over it.
constexpr float kTextbookRange = 5.0f;
constexpr float kTextbookNoise = 0.5f;

// --- Parsing.

template <typename Enum>
struct Choice {
  absl::string_view name;
  Enum value;
};

template <typename Enum, size_t N>
absl::StatusOr<Enum> ParseChoice(absl::string_view text,
                                 const Choice<Enum> (&choices)[N]) {
  for (const Choice<Enum>& choice : choices) {
    if (text == choice.name) return choice.value;
  }
  std::vector<absl::string_view> names;
  for (const Choice<Enum>& choice : choices) names.push_back(choice.name);
  return absl::InvalidArgumentError(absl::StrFormat(
      "expected one of %s, got '%s'", absl::StrJoin(names, ", "), text));
}

// --- Generating.

int64_t ElementCount(const Dims& dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1},
                         std::multiplies<int64_t>());
}

void SetShape(const Dims& dims, Tensor* tensor) {
  tensor->mutable_shape()->Assign(dims.begin(), dims.end());
}

std::string DimsText(const Dims& dims) { return absl::StrJoin(dims, "x"); }

// Every --shape name must be a tensor of this request.
absl::Status CheckShapeNames(const RequestOptions& options,
                             std::vector<absl::string_view> tensor_names) {
  for (const NamedShape& shape : options.shapes) {
    if (std::find(tensor_names.begin(), tensor_names.end(), shape.name) ==
        tensor_names.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--shape: this request has no tensor '%s' (its tensors: %s)",
          shape.name, absl::StrJoin(tensor_names, ", ")));
    }
  }
  return absl::OkStatus();
}

// The shape to generate tensor `name` with: its --shape, else `fallback`
// when generating every missing tensor, else none (leave the tensor alone).
std::optional<Dims> DimsToGenerate(const RequestOptions& options,
                                   absl::string_view name,
                                   const Dims& fallback) {
  for (const NamedShape& shape : options.shapes) {
    if (shape.name == name) return shape.dims;
  }
  if (options.generate_missing) return fallback;
  return std::nullopt;
}

bool NamedInShapes(const RequestOptions& options, absl::string_view name) {
  return std::any_of(
      options.shapes.begin(), options.shapes.end(),
      [name](const NamedShape& shape) { return shape.name == name; });
}

// Dimension `index` of `tensor`, counted from the end when negative; or
// `fallback` when the tensor has no such dimension.
int64_t DimOr(const Tensor& tensor, int index, int64_t fallback) {
  const int rank = tensor.shape_size();
  const int position = index < 0 ? rank + index : index;
  if (position < 0 || position >= rank) return fallback;
  return tensor.shape(position);
}

void FillNormal(const Dims& dims, std::mt19937& rng, Tensor* tensor) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> elements(ElementCount(dims));
  for (float& element : elements) element = normal(rng);
  SetShape(dims, tensor);
  WriteElements(elements, attention::v1::TENSOR_ENCODING_VALUES, tensor);
}

// The regression inputs are (n,) or (n, d).
absl::Status CheckRegressionDims(absl::string_view name, const Dims& dims) {
  if (dims.size() == 1 || dims.size() == 2) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "--shape %s=%s: the regression data generator makes (n,) or (n, d) "
      "tensors",
      name, DimsText(dims)));
}

int64_t Columns(const Dims& dims) { return dims.size() == 2 ? dims[1] : 1; }

// x_train: U[0, 5), rows sorted by their first column.
void FillTextbookX(const Dims& dims, std::mt19937& rng, Tensor* x) {
  std::uniform_real_distribution<float> uniform(0.0f, kTextbookRange);
  const int64_t rows = dims[0];
  const int64_t columns = Columns(dims);
  std::vector<float> drawn(rows * columns);
  for (float& coordinate : drawn) coordinate = uniform(rng);
  std::vector<int64_t> order(rows);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return drawn[a * columns] < drawn[b * columns];
  });
  std::vector<float> elements;
  elements.reserve(drawn.size());
  for (const int64_t row : order) {
    elements.insert(elements.end(), drawn.begin() + row * columns,
                    drawn.begin() + (row + 1) * columns);
  }
  SetShape(dims, x);
  WriteElements(elements, attention::v1::TENSOR_ENCODING_VALUES, x);
}

// y_train from x_train's values: 2 sin(x) + x^0.8 + N(0, 0.5^2), x being
// the first column; every column of y gets its own noise.
absl::Status FillTextbookY(const Tensor& x, const Dims& dims, std::mt19937& rng,
                           Tensor* y) {
  absl::StatusOr<std::vector<float>> x_elements = ReadElements(x);
  if (!x_elements.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("x_train: ", x_elements.status().message()));
  }
  const int64_t rows = dims[0];
  if (x.shape_size() == 0 || x.shape(0) != rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "y_train is generated from x_train, so it needs as many rows: y_train "
        "%s, x_train %s",
        DimsText(dims),
        x.shape_size() == 0 ? "absent" : absl::StrJoin(x.shape(), "x")));
  }
  const int64_t x_columns = x.shape_size() == 2 ? x.shape(1) : 1;
  const int64_t count = static_cast<int64_t>(x_elements->size());
  const bool x_fits_its_shape =
      x_columns >= 1 &&
      (rows == 0 ? count == 0 : count % rows == 0 && count / rows == x_columns);
  if (!x_fits_its_shape) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "x_train holds %d values, which do not fit its shape %s", count,
        absl::StrJoin(x.shape(), "x")));
  }
  std::normal_distribution<float> noise(0.0f, kTextbookNoise);
  const int64_t columns = Columns(dims);
  std::vector<float> elements;
  elements.reserve(rows * columns);
  for (int64_t i = 0; i < rows; ++i) {
    const float s = (*x_elements)[i * x_columns];
    const float clean = 2.0f * std::sin(s) + std::pow(std::abs(s), 0.8f);
    for (int64_t j = 0; j < columns; ++j) {
      elements.push_back(clean + noise(rng));
    }
  }
  SetShape(dims, y);
  WriteElements(elements, attention::v1::TENSOR_ENCODING_VALUES, y);
  return absl::OkStatus();
}

// x_query: row i is 5 i / m in every column (np.arange(0, 5, 0.1) for 50).
void FillEvenlySpaced(const Dims& dims, Tensor* x) {
  const int64_t rows = dims[0];
  const int64_t columns = Columns(dims);
  std::vector<float> elements;
  elements.reserve(rows * columns);
  for (int64_t i = 0; i < rows; ++i) {
    const float value = kTextbookRange * static_cast<float>(i) / rows;
    for (int64_t j = 0; j < columns; ++j) elements.push_back(value);
  }
  SetShape(dims, x);
  WriteElements(elements, attention::v1::TENSOR_ENCODING_VALUES, x);
}

// Fills x_train and y_train with the textbook's data, as far as asked.
// Request: NadarayaWatsonRequest or FitBandwidthRequest.
template <typename Request>
absl::Status MaybeFillTrainingData(const RequestOptions& options,
                                   std::mt19937& rng, Request* request) {
  if (std::optional<Dims> dims =
          DimsToGenerate(options, "x_train", {kTextbookPoints})) {
    if (absl::Status status = CheckRegressionDims("x_train", *dims);
        !status.ok()) {
      return status;
    }
    FillTextbookX(*dims, rng, request->mutable_x_train());
  }
  if (std::optional<Dims> dims =
          DimsToGenerate(options, "y_train",
                         {DimOr(request->x_train(), 0, kTextbookPoints)})) {
    if (absl::Status status = CheckRegressionDims("y_train", *dims);
        !status.ok()) {
      return status;
    }
    return FillTextbookY(request->x_train(), *dims, rng,
                         request->mutable_y_train());
  }
  return absl::OkStatus();
}

// Re-encodes every tensor of the request as --encoding asks.
absl::Status ApplyEncoding(const RequestOptions& options,
                           google::protobuf::Message* request) {
  if (!options.encoding.has_value()) return absl::OkStatus();
  absl::Status first_error;
  ForEachTensor(request, [&](const std::string& path, Tensor* tensor) {
    absl::Status status = Reencode(*options.encoding, tensor);
    if (!status.ok() && first_error.ok()) {
      first_error = absl::InvalidArgumentError(absl::StrCat(
          "--encoding: cannot re-encode ", path, ": ", status.message()));
    }
  });
  return first_error;
}

}  // namespace

absl::StatusOr<Dims> ParseDims(absl::string_view text) {
  if (text.empty()) return absl::InvalidArgumentError("empty shape");
  Dims dims;
  int64_t elements = 1;
  for (absl::string_view item : absl::StrSplit(text, 'x')) {
    int64_t dim;
    if (!absl::SimpleAtoi(item, &dim) || dim < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "bad shape '%s': dimensions are non-negative integers joined by "
          "'x', like 2x10x4",
          text));
    }
    if (dim > kMaxGeneratedElements ||
        (dim > 0 && elements > kMaxGeneratedElements / dim)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "shape '%s' has more than %d elements", text, kMaxGeneratedElements));
    }
    elements *= dim;
    dims.push_back(dim);
  }
  if (dims.size() > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shape '%s' has more than %d dimensions", text, kMaxRank));
  }
  return dims;
}

absl::StatusOr<std::vector<NamedShape>> ParseShapes(
    const std::vector<std::string>& items) {
  std::vector<NamedShape> shapes;
  for (const std::string& item : items) {
    if (item.empty()) continue;
    std::pair<absl::string_view, absl::string_view> name_and_dims =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    const absl::string_view name = name_and_dims.first;
    if (name.empty() || item.find('=') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "expected NAME=DIMS like queries=2x1x2, got '%s'", item));
    }
    absl::StatusOr<Dims> dims = ParseDims(name_and_dims.second);
    if (!dims.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", dims.status().message()));
    }
    for (const NamedShape& earlier : shapes) {
      if (earlier.name == name) {
        return absl::InvalidArgumentError(
            absl::StrFormat("'%s' is given twice", name));
      }
    }
    shapes.push_back({std::string(name), *std::move(dims)});
  }
  return shapes;
}

absl::StatusOr<Lengths> ParseLengths(absl::string_view values,
                                     const Dims& shape) {
  Lengths lengths;
  for (absl::string_view item : absl::StrSplit(values, ',')) {
    int32_t length;
    if (!absl::SimpleAtoi(item, &length)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'%s' is not an integer (expected a comma list like 2,6)", item));
    }
    lengths.add_values(length);
  }
  const Dims dims = shape.empty() ? Dims{lengths.values_size()} : shape;
  if (ElementCount(dims) != lengths.values_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d valid lengths given but shape %s holds %d", lengths.values_size(),
        DimsText(dims), ElementCount(dims)));
  }
  lengths.mutable_shape()->Assign(dims.begin(), dims.end());
  return lengths;
}

absl::StatusOr<attention::v1::Score> ParseScore(absl::string_view text) {
  static constexpr Choice<attention::v1::Score> kChoices[] = {
      {"dot", attention::v1::SCORE_DOT_PRODUCT},
      {"gaussian", attention::v1::SCORE_GAUSSIAN}};
  return ParseChoice(text, kChoices);
}

absl::StatusOr<attention::v1::Precision> ParsePrecision(
    absl::string_view text) {
  static constexpr Choice<attention::v1::Precision> kChoices[] = {
      {"fp32", attention::v1::PRECISION_FLOAT32},
      {"bf16", attention::v1::PRECISION_BFLOAT16},
      {"fp16", attention::v1::PRECISION_FLOAT16}};
  return ParseChoice(text, kChoices);
}

absl::StatusOr<attention::v1::RegressionKernel> ParseKernel(
    absl::string_view text) {
  static constexpr Choice<attention::v1::RegressionKernel> kChoices[] = {
      {"gaussian", attention::v1::REGRESSION_KERNEL_GAUSSIAN},
      {"boxcar", attention::v1::REGRESSION_KERNEL_BOXCAR},
      {"constant", attention::v1::REGRESSION_KERNEL_CONSTANT},
      {"epanechnikov", attention::v1::REGRESSION_KERNEL_EPANECHNIKOV}};
  return ParseChoice(text, kChoices);
}

absl::StatusOr<attention::v1::TensorEncoding> ParseEncoding(
    absl::string_view text) {
  static constexpr Choice<attention::v1::TensorEncoding> kChoices[] = {
      {"values", attention::v1::TENSOR_ENCODING_VALUES},
      {"raw", attention::v1::TENSOR_ENCODING_RAW}};
  return ParseChoice(text, kChoices);
}

absl::Status ApplyOptions(const RequestOptions& options,
                          MaskedSoftmaxRequest* request) {
  if (absl::Status status = CheckShapeNames(options, {"x"}); !status.ok()) {
    return status;
  }
  std::mt19937 rng(options.seed);
  if (std::optional<Dims> dims = DimsToGenerate(options, "x", {2, 2, 4})) {
    FillNormal(*dims, rng, request->mutable_x());
  }
  if (options.valid_lens) *request->mutable_valid_lens() = *options.valid_lens;
  if (options.encoding) request->set_output_encoding(*options.encoding);
  return ApplyEncoding(options, request);
}

absl::Status ApplyOptions(const RequestOptions& options,
                          BatchMatmulRequest* request) {
  if (absl::Status status = CheckShapeNames(options, {"a", "b"});
      !status.ok()) {
    return status;
  }
  std::mt19937 rng(options.seed);
  if (std::optional<Dims> dims = DimsToGenerate(options, "a", {2, 1, 4})) {
    FillNormal(*dims, rng, request->mutable_a());
  }
  if (std::optional<Dims> dims = DimsToGenerate(options, "b", {2, 4, 6})) {
    FillNormal(*dims, rng, request->mutable_b());
  }
  if (options.precision) request->set_precision(*options.precision);
  if (options.encoding) request->set_output_encoding(*options.encoding);
  return ApplyEncoding(options, request);
}

absl::Status ApplyOptions(const RequestOptions& options,
                          AttentionRequest* request) {
  if (absl::Status status =
          CheckShapeNames(options, {"queries", "keys", "values"});
      !status.ok()) {
    return status;
  }
  std::mt19937 rng(options.seed);
  if (std::optional<Dims> dims =
          DimsToGenerate(options, "queries", {2, 1, 2})) {
    FillNormal(*dims, rng, request->mutable_queries());
  }
  // A stored memory holds the keys and values: none are generated for it
  // unless asked for by name.
  RequestOptions kv_options = options;
  if (options.memory_name.has_value()) {
    request->set_memory_name(*options.memory_name);
    kv_options.generate_missing = false;
  }
  if (std::optional<Dims> dims =
          DimsToGenerate(kv_options, "keys", {2, 10, 2})) {
    FillNormal(*dims, rng, request->mutable_keys());
  }
  if (std::optional<Dims> dims =
          DimsToGenerate(kv_options, "values", {2, 10, 4})) {
    FillNormal(*dims, rng, request->mutable_values());
  }
  if (options.valid_lens) *request->mutable_valid_lens() = *options.valid_lens;
  if (options.causal) request->set_causal(*options.causal);
  if (options.scale) request->set_scale(*options.scale);
  if (options.score) request->set_score(*options.score);
  if (options.return_weights)
    request->set_return_weights(*options.return_weights);
  if (options.precision) request->set_precision(*options.precision);
  if (options.encoding) request->set_output_encoding(*options.encoding);
  return ApplyEncoding(options, request);
}

absl::Status ApplyOptions(const RequestOptions& options,
                          AdditiveAttentionRequest* request) {
  if (absl::Status status = CheckShapeNames(
          options, {"queries", "keys", "values", "w_q", "w_k", "w_v"});
      !status.ok()) {
    return status;
  }
  std::mt19937 rng(options.seed);
  if (std::optional<Dims> dims =
          DimsToGenerate(options, "queries", {2, 1, 20})) {
    FillNormal(*dims, rng, request->mutable_queries());
  }
  if (std::optional<Dims> dims = DimsToGenerate(options, "keys", {2, 10, 2})) {
    FillNormal(*dims, rng, request->mutable_keys());
  }
  if (std::optional<Dims> dims =
          DimsToGenerate(options, "values", {2, 10, 4})) {
    FillNormal(*dims, rng, request->mutable_values());
  }
  // Touch `weights` only when generating some of them: it shares a oneof
  // with `weights_name`.
  if (options.generate_missing || NamedInShapes(options, "w_q") ||
      NamedInShapes(options, "w_k") || NamedInShapes(options, "w_v")) {
    // The hidden width h: from a --shape of any weight, else the textbook's.
    int64_t hidden = kTextbookHidden;
    for (const NamedShape& shape : options.shapes) {
      if (absl::StartsWith(shape.name, "w_") && !shape.dims.empty()) {
        hidden = shape.dims[0];
        break;
      }
    }
    attention::v1::AdditiveWeights* weights = request->mutable_weights();
    if (std::optional<Dims> dims = DimsToGenerate(
            options, "w_q", {hidden, DimOr(request->queries(), -1, 20)})) {
      FillNormal(*dims, rng, weights->mutable_w_q());
    }
    if (std::optional<Dims> dims = DimsToGenerate(
            options, "w_k", {hidden, DimOr(request->keys(), -1, 2)})) {
      FillNormal(*dims, rng, weights->mutable_w_k());
    }
    if (std::optional<Dims> dims = DimsToGenerate(options, "w_v", {hidden})) {
      FillNormal(*dims, rng, weights->mutable_w_v());
    }
  }
  if (options.valid_lens) *request->mutable_valid_lens() = *options.valid_lens;
  if (options.return_weights)
    request->set_return_weights(*options.return_weights);
  if (options.encoding) request->set_output_encoding(*options.encoding);
  return ApplyEncoding(options, request);
}

absl::Status ApplyOptions(const RequestOptions& options,
                          NadarayaWatsonRequest* request) {
  if (absl::Status status =
          CheckShapeNames(options, {"x_train", "y_train", "x_query"});
      !status.ok()) {
    return status;
  }
  std::mt19937 rng(options.seed);
  // A stored model may hold the training set: none is generated for it
  // unless asked for by name.
  RequestOptions train_options = options;
  if (options.model_name.has_value()) {
    request->set_model_name(*options.model_name);
    train_options.generate_missing = false;
  }
  if (absl::Status status = MaybeFillTrainingData(train_options, rng, request);
      !status.ok()) {
    return status;
  }
  Dims default_query_dims = {kTextbookPoints};
  if (request->x_train().shape_size() == 2) {
    default_query_dims.push_back(request->x_train().shape(1));
  }
  if (std::optional<Dims> dims =
          DimsToGenerate(options, "x_query", default_query_dims)) {
    if (absl::Status status = CheckRegressionDims("x_query", *dims);
        !status.ok()) {
      return status;
    }
    FillEvenlySpaced(*dims, request->mutable_x_query());
  }
  if (options.kernel) request->set_kernel(*options.kernel);
  if (options.bandwidth) request->set_bandwidth(*options.bandwidth);
  if (options.return_weights)
    request->set_return_weights(*options.return_weights);
  if (options.encoding) request->set_output_encoding(*options.encoding);
  return ApplyEncoding(options, request);
}

absl::Status ApplyOptions(const RequestOptions& options,
                          FitBandwidthRequest* request) {
  if (absl::Status status = CheckShapeNames(options, {"x_train", "y_train"});
      !status.ok()) {
    return status;
  }
  std::mt19937 rng(options.seed);
  // A stored model's own set is the fit's: none is generated unless named.
  RequestOptions set_options = options;
  if (options.model_name.has_value()) {
    request->set_model_name(*options.model_name);
    set_options.generate_missing = false;
  }
  if (absl::Status status = MaybeFillTrainingData(set_options, rng, request);
      !status.ok()) {
    return status;
  }
  if (options.initial_bandwidth) {
    request->set_initial_bandwidth(*options.initial_bandwidth);
  }
  if (options.learning_rate) request->set_learning_rate(*options.learning_rate);
  if (options.epochs) request->set_epochs(*options.epochs);
  if (options.save_as) request->set_save_as(*options.save_as);
  return ApplyEncoding(options, request);
}

absl::Status ApplyOptions(const RequestOptions& options,
                          AppendMemoryRequest* request) {
  if (absl::Status status = CheckShapeNames(options, {"keys", "values"});
      !status.ok()) {
    return status;
  }
  std::mt19937 rng(options.seed);
  if (std::optional<Dims> dims = DimsToGenerate(options, "keys", {10, 2})) {
    FillNormal(*dims, rng, request->mutable_keys());
  }
  if (std::optional<Dims> dims = DimsToGenerate(options, "values", {10, 4})) {
    FillNormal(*dims, rng, request->mutable_values());
  }
  if (options.memory_name) request->set_name(*options.memory_name);
  if (options.create) {
    attention::v1::MemoryCreation* create = request->mutable_create();
    if (options.score) create->set_score(*options.score);
    if (options.scale) create->set_scale(*options.scale);
    if (options.precision) create->set_precision(*options.precision);
    if (options.max_rows) create->set_max_rows(*options.max_rows);
  } else if (options.score || options.scale || options.precision ||
             options.max_rows) {
    return absl::InvalidArgumentError(
        "--score, --scale, --precision and --max_rows make a new memory: "
        "give --create with them");
  }
  return ApplyEncoding(options, request);
}

absl::Status ApplyOptions(const RequestOptions& options,
                          attention::v1::EvictMemoryRequest* request) {
  if (absl::Status status = CheckShapeNames(options, {}); !status.ok()) {
    return status;
  }
  if (options.memory_name) request->set_name(*options.memory_name);
  if (options.oldest) request->set_oldest(*options.oldest);
  return absl::OkStatus();
}

}  // namespace attnctl

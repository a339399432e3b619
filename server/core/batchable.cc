#include "server/core/batchable.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "attn/status_macros.h"
#include "attn/validate.h"
#include "attn/work.h"

namespace attnserve {
namespace {

// Keys hold floats by their bits: a printed float rounds, and two scales
// that print alike must not share a batch.
uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

absl::string_view BytesOf(const attn::TensorView& view) {
  return absl::string_view(reinterpret_cast<const char*>(view.data),
                           sizeof(float) * view.num_elements());
}

// A hash of operands that every member of a class must share.
size_t ContentHash(std::initializer_list<attn::TensorView> views) {
  size_t hash = 0;
  for (const attn::TensorView& view : views) {
    hash = absl::HashOf(hash, BytesOf(view), view.shape);
  }
  return hash;
}

bool SameContents(const attn::TensorView& a, const attn::TensorView& b) {
  if (a.shape != b.shape) return false;
  if (a.data == b.data) return true;  // the same repository tensor
  return BytesOf(a) == BytesOf(b);
}

void CopyFloats(const float* src, int64_t count, float* dst) {
  if (count > 0) std::memcpy(dst, src, sizeof(float) * count);
}

// Per-row valid lengths of a padded batch: member rows keep their limit
// (their own column count when they had no lengths, so that padded
// columns get zero weight), padded rows get 0. Absent when no member has
// lengths or padding: the kernels' unmasked path is the faster one.
class PaddedLengths {
 public:
  PaddedLengths() = default;
  PaddedLengths(int64_t total_batch, int64_t rows, int64_t columns)
      : rows_(rows),
        columns_(columns),
        total_batch_(total_batch),
        lengths_(total_batch * rows, 0) {}
  void Add(int64_t batch_offset, int64_t batch, int64_t rows, int64_t columns,
           const attn::ValidLengths& valid) {
    needed_ |= valid.kind != attn::ValidLengths::Kind::kNone ||
               rows != rows_ || columns != columns_;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < rows; ++i) {
        lengths_[(batch_offset + b) * rows_ + i] =
            static_cast<int32_t>(valid.Limit(b, i, columns));
      }
    }
  }
  attn::LengthsView view() const {
    if (!needed_) return attn::LengthsView{};
    return attn::LengthsView{lengths_.data(), {total_batch_, rows_}};
  }

 private:
  int64_t rows_ = 0, columns_ = 0, total_batch_ = 0;
  bool needed_ = false;
  std::vector<int32_t> lengths_;
};

// Copies `blocks` blocks of `rows` x `width` floats (dense) into a
// destination whose blocks are `padded_rows` x `padded_width`, each at the
// top left of its block; the padding is left as it is (zeros).
void CopyPadded(const float* src, int64_t blocks, int64_t rows, int64_t width,
                int64_t padded_rows, int64_t padded_width, float* dst) {
  for (int64_t block = 0; block < blocks; ++block) {
    for (int64_t row = 0; row < rows; ++row) {
      CopyFloats(src + (block * rows + row) * width, width,
                 dst + (block * padded_rows + row) * padded_width);
    }
  }
}

// The inverse: a member's blocks, starting at block `first_block` of the
// padded result, into a dense tensor of `shape`.
attn::Tensor SlicePadded(const attn::Tensor& all, int64_t first_block,
                         int64_t blocks, int64_t rows, int64_t width,
                         int64_t padded_rows, int64_t padded_width,
                         attn::Shape shape) {
  attn::Tensor out = attn::Tensor::Uninitialized(std::move(shape));
  for (int64_t block = 0; block < blocks; ++block) {
    for (int64_t row = 0; row < rows; ++row) {
      CopyFloats(
          all.data.data() +
              ((first_block + block) * padded_rows + row) * padded_width,
          width, out.data.data() + (block * rows + row) * width);
    }
  }
  return out;
}

// The combined inputs live in buffers each batch thread keeps between
// batches: a combined call's buffers, freed and faulted in again every time
// (glibc returns large freed blocks at the top of the heap to the system),
// made it 3-6x slower than its requests run alone (bench/core_benchmark.cc,
// BM_Combine; ~570 page faults per batch of 32 64x64 products).
class Staging {
 public:
  // A tensor of `shape` in buffer `slot` (0-3), zero-filled when `zero`;
  // valid on this thread until the next call for the same slot.
  struct Staged {
    float* ptr = nullptr;
    attn::Shape shape;
    float* data() const { return ptr; }
    attn::TensorView view() const { return attn::TensorView{ptr, shape}; }
  };
  static Staged Get(int slot, attn::Shape shape, bool zero) {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    std::vector<float>& buffer = Buffers()[slot];
    if (static_cast<int64_t>(buffer.size()) < count) {
      buffer.clear();
      buffer.shrink_to_fit();
      buffer.resize(count);
    }
    if (zero) std::fill(buffer.begin(), buffer.begin() + count, 0.0f);
    return Staged{buffer.data(), std::move(shape)};
  }
  // Frees buffers beyond what a thread keeps (a rare huge batch).
  static void Trim() {
    for (std::vector<float>& buffer : Buffers()) {
      if (buffer.size() * sizeof(float) > kKeptBytesPerSlot) {
        std::vector<float>().swap(buffer);
      }
    }
  }

 private:
  static constexpr size_t kKeptBytesPerSlot = size_t{4} << 20;
  static std::array<std::vector<float>, 4>& Buffers() {
    thread_local std::array<std::vector<float>, 4> buffers;
    return buffers;
  }
};

// The params of a request that Schedule has validated in full: shapes
// only, without the 16-bit range check, which reads every operand (the
// engine checks it again anyway).
attn::MaskedSoftmaxParams ParamsOf(const attn::MaskedSoftmaxRequest& r) {
  return attn::ValidateMaskedSoftmax(r)->params;
}
attn::BatchMatmulParams ParamsOf(attn::BatchMatmulRequest r) {
  r.precision = attn::Precision::kFloat32;
  return attn::ValidateBatchMatmul(r)->params;
}
attn::AttentionParams ParamsOf(attn::AttentionRequest r) {
  // Keys and values held as bfloat16 go with that precision only, and are
  // never scanned.
  if (r.keys_bfloat16 == nullptr) r.precision = attn::Precision::kFloat32;
  return attn::ValidateAttention(r)->params;
}
attn::AdditiveAttentionParams ParamsOf(const attn::AdditiveAttentionRequest& r) {
  return attn::ValidateAdditiveAttention(r)->params;
}
attn::NadarayaWatsonParams ParamsOf(const attn::NadarayaWatsonRequest& r) {
  return attn::ValidateNadarayaWatson(r)->params;
}

// --- one set of rules per operation ---------------------------------------

absl::StatusOr<BatchClass> Classify(const attn::MaskedSoftmaxRequest& r) {
  ASSIGN_OR_RETURN(auto plan, attn::ValidateMaskedSoftmax(r));
  const auto& p = plan.params;
  return BatchClass{absl::StrCat("masked_softmax/", r.x.rank()),
                    p.batch * p.rows * p.columns};
}

absl::StatusOr<BatchClass> Classify(const attn::BatchMatmulRequest& r) {
  ASSIGN_OR_RETURN(auto plan, attn::ValidateBatchMatmul(r));
  const auto& p = plan.params;
  return BatchClass{absl::StrCat("batch_matmul/", p.k, "/", p.p, "/",
                                 static_cast<int>(p.precision)),
                    p.n * (p.m * p.k + p.k * p.p)};
}

absl::StatusOr<BatchClass> Classify(const attn::AttentionRequest& r) {
  ASSIGN_OR_RETURN(auto plan, attn::ValidateAttention(r));
  const auto& p = plan.params;
  return BatchClass{
      absl::StrCat("attention/", r.queries.rank(), "/", p.heads, "/", p.d, "/",
                   p.dv, "/", static_cast<int>(p.score), "/", Bits(p.scale),
                   "/", p.causal, "/", static_cast<int>(p.precision), "/",
                   r.return_weights),
      p.batch * p.heads * (p.lq * p.d + p.lk * (p.d + p.dv))};
}

absl::StatusOr<BatchClass> Classify(const attn::AdditiveAttentionRequest& r) {
  ASSIGN_OR_RETURN(auto plan, attn::ValidateAdditiveAttention(r));
  const auto& p = plan.params;
  return BatchClass{
      absl::StrCat("additive/", p.dq, "/", p.dk, "/", p.h, "/", p.dv, "/",
                   r.return_weights, "/", ContentHash({r.w_q, r.w_k, r.w_v})),
      p.batch * (p.lq * p.dq + p.lk * (p.dk + p.dv))};
}

// `training_set`: what the requests' x_train and y_train must be to share
// a class, their contents' hash or a stored version's identity.
absl::StatusOr<BatchClass> ClassifyRegression(
    const attn::NadarayaWatsonRequest& r, absl::string_view training_set) {
  ASSIGN_OR_RETURN(auto plan, attn::ValidateNadarayaWatson(r));
  const auto& p = plan.params;
  return BatchClass{
      absl::StrCat("nadaraya_watson/", r.x_query.rank(), "/", r.y_train.rank(),
                   "/", p.dx, "/", p.dy, "/", static_cast<int>(p.kernel), "/",
                   Bits(p.bandwidth), "/", r.return_weights, "/",
                   training_set),
      p.n_query * p.dx};
}

absl::StatusOr<BatchClass> Classify(const attn::NadarayaWatsonRequest& r) {
  return ClassifyRegression(r, absl::StrCat(ContentHash({r.x_train, r.y_train})));
}

// A stored training set is keyed by identity: never hashed, never compared
// (it may hold millions of points).
absl::StatusOr<BatchClass> Classify(const StoredRegressionRequest& r) {
  return ClassifyRegression(
      r.regression,
      absl::StrCat("stored/", reinterpret_cast<uintptr_t>(r.training_set)));
}

// Every query of every request attends to the same memory: the class is the
// memory itself (the stored version, by identity; its contents are never
// hashed), and the queries are stacked.
absl::StatusOr<BatchClass> Classify(const MemoryAttentionRequest& r) {
  ASSIGN_OR_RETURN(auto plan, attn::ValidateAttention(r.attention));
  const auto& p = plan.params;
  return BatchClass{
      absl::StrCat("memory/", reinterpret_cast<uintptr_t>(r.memory), "/",
                   p.d, "/", p.dv, "/", static_cast<int>(p.score), "/",
                   Bits(p.scale), "/", static_cast<int>(p.precision), "/",
                   r.attention.return_weights),
      p.lq * p.d,
      /*shares_a_pass=*/p.lk >= 2 * attn::kMinKeysPerShare};
}

// Whether `r` may join a batch led by `first` (their keys are equal).
template <typename Request>
bool SharesOperands(const Request&, const Request&) {
  return true;
}
bool SharesOperands(const attn::AdditiveAttentionRequest& a,
                    const attn::AdditiveAttentionRequest& b) {
  return SameContents(a.w_q, b.w_q) && SameContents(a.w_k, b.w_k) &&
         SameContents(a.w_v, b.w_v);
}
bool SharesOperands(const attn::NadarayaWatsonRequest& a,
                    const attn::NadarayaWatsonRequest& b) {
  return SameContents(a.x_train, b.x_train) &&
         SameContents(a.y_train, b.y_train);
}

using Results = std::vector<absl::StatusOr<attn::OpResult>>;

Results Combine(attn::Engine& engine,
                const std::vector<const attn::MaskedSoftmaxRequest*>& members,
                CombinedWork* work) {
  std::vector<attn::MaskedSoftmaxParams> params;
  int64_t total = 0, rows = 0, columns = 0;
  for (const auto* r : members) {
    params.push_back(ParamsOf(*r));
    total += params.back().batch;
    rows = std::max(rows, params.back().rows);
    columns = std::max(columns, params.back().columns);
  }
  const Staging::Staged x = Staging::Get(0, {total, rows, columns}, true);
  PaddedLengths lengths(total, rows, columns);
  int64_t offset = 0;
  for (const auto& p : params) {
    CopyPadded(p.x, p.batch, p.rows, p.columns, rows, columns,
               x.data() + offset * rows * columns);
    lengths.Add(offset, p.batch, p.rows, p.columns, p.valid);
    work->useful_elements += p.batch * p.rows * p.columns;
    offset += p.batch;
  }
  work->computed_elements = total * rows * columns;
  attn::MaskedSoftmaxRequest combined{x.view(), lengths.view()};
  absl::StatusOr<attn::OpResult> all = engine.MaskedSoftmax(combined);
  if (!all.ok()) return {};
  Results results;
  offset = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    const auto& p = params[i];
    attn::OpResult result;
    result.implementation = all->implementation;
    result.output = SlicePadded(all->output, offset, p.batch, p.rows, p.columns,
                                rows, columns, members[i]->x.shape);
    offset += p.batch;
    results.push_back(std::move(result));
  }
  return results;
}

Results Combine(attn::Engine& engine,
                const std::vector<const attn::BatchMatmulRequest*>& members,
                CombinedWork* work) {
  std::vector<attn::BatchMatmulParams> params;
  int64_t total = 0, m = 0;
  for (const auto* r : members) {
    params.push_back(ParamsOf(*r));
    total += params.back().n;
    m = std::max(m, params.back().m);
  }
  const int64_t k = params.front().k, p_cols = params.front().p;
  const Staging::Staged a = Staging::Get(0, {total, m, k}, true);
  const Staging::Staged b = Staging::Get(1, {total, k, p_cols}, false);
  int64_t offset = 0;
  for (const auto& p : params) {
    CopyPadded(p.a, p.n, p.m, k, m, k, a.data() + offset * m * k);
    CopyFloats(p.b, p.n * k * p_cols, b.data() + offset * k * p_cols);
    work->useful_elements += p.n * p.m * p_cols;
    offset += p.n;
  }
  work->computed_elements = total * m * p_cols;
  attn::BatchMatmulRequest combined{a.view(), b.view(),
                                    members.front()->precision};
  absl::StatusOr<attn::OpResult> all = engine.BatchMatmul(combined);
  if (!all.ok()) return {};
  Results results;
  offset = 0;
  for (const auto& p : params) {
    attn::OpResult result;
    result.implementation = all->implementation;
    result.output = SlicePadded(all->output, offset, p.n, p.m, p_cols, m,
                                p_cols, {p.n, p.m, p_cols});
    offset += p.n;
    results.push_back(std::move(result));
  }
  return results;
}

// The layout of an attention-like request (attention, additive attention):
// `heads` blocks per batch entry, each Lq queries of width dq, Lk keys of
// width dk and values of width dv, and how its tensors are shaped.
struct AttentionLayout {
  int64_t heads, dq, dk, dv;
  bool multi_head;  // (B, H, L, depth) tensors; else (B, L, depth)
  attn::Shape Shape(int64_t batch, int64_t length, int64_t depth) const {
    return multi_head ? attn::Shape{batch, heads, length, depth}
                      : attn::Shape{batch, length, depth};
  }
};

// Attention-like members' queries, keys and values padded to the longest
// Lq and Lk, with their per-row lengths; counts the work.
struct PaddedAttentionInputs {
  int64_t total = 0, lq = 0, lk = 0;  // batch entries, padded lengths
  Staging::Staged q, k, v;
  PaddedLengths lengths;
};
template <typename Params>
PaddedAttentionInputs PadAttentionInputs(const std::vector<Params>& params,
                                         const AttentionLayout& layout,
                                         CombinedWork* work) {
  PaddedAttentionInputs in;
  for (const Params& p : params) {
    in.total += p.batch;
    in.lq = std::max(in.lq, p.lq);
    in.lk = std::max(in.lk, p.lk);
  }
  const int64_t h = layout.heads;
  in.q = Staging::Get(0, layout.Shape(in.total, in.lq, layout.dq), true);
  in.k = Staging::Get(1, layout.Shape(in.total, in.lk, layout.dk), true);
  in.v = Staging::Get(2, layout.Shape(in.total, in.lk, layout.dv), true);
  in.lengths = PaddedLengths(in.total, in.lq, in.lk);
  int64_t offset = 0;
  for (const Params& p : params) {
    const int64_t blocks = p.batch * h, first = offset * h;
    CopyPadded(p.q, blocks, p.lq, layout.dq, in.lq, layout.dq,
               in.q.data() + first * in.lq * layout.dq);
    CopyPadded(p.k, blocks, p.lk, layout.dk, in.lk, layout.dk,
               in.k.data() + first * in.lk * layout.dk);
    CopyPadded(p.v, blocks, p.lk, layout.dv, in.lk, layout.dv,
               in.v.data() + first * in.lk * layout.dv);
    in.lengths.Add(offset, p.batch, p.lq, p.lk, p.valid);
    work->useful_elements += blocks * p.lq * p.lk;
    offset += p.batch;
  }
  work->computed_elements = in.total * h * in.lq * in.lk;
  return in;
}

// Each member's output and weights out of the padded result.
template <typename Params>
Results SliceAttentionResults(const attn::OpResult& all,
                              const std::vector<Params>& params,
                              const AttentionLayout& layout,
                              const PaddedAttentionInputs& in) {
  Results results;
  int64_t offset = 0;
  for (const Params& p : params) {
    const int64_t blocks = p.batch * layout.heads, first = offset * layout.heads;
    attn::OpResult result;
    result.implementation = all.implementation;
    result.output =
        SlicePadded(all.output, first, blocks, p.lq, layout.dv, in.lq,
                    layout.dv, layout.Shape(p.batch, p.lq, layout.dv));
    if (!all.weights.empty()) {
      result.weights = SlicePadded(all.weights, first, blocks, p.lq, p.lk,
                                   in.lq, in.lk, layout.Shape(p.batch, p.lq, p.lk));
    }
    offset += p.batch;
    results.push_back(std::move(result));
  }
  return results;
}

Results Combine(attn::Engine& engine,
                const std::vector<const attn::AttentionRequest*>& members,
                CombinedWork* work) {
  std::vector<attn::AttentionParams> params;
  for (const auto* r : members) {
    params.push_back(ParamsOf(*r));
  }
  const attn::AttentionRequest& like = *members.front();
  const attn::AttentionParams& first = params.front();
  const AttentionLayout layout{first.heads, first.d, first.d, first.dv,
                               like.queries.rank() == 4};
  const PaddedAttentionInputs in = PadAttentionInputs(params, layout, work);
  attn::AttentionRequest combined;
  combined.queries = in.q.view();
  combined.keys = in.k.view();
  combined.values = in.v.view();
  combined.valid_lens = in.lengths.view();
  combined.causal = like.causal;
  combined.scale = first.scale;
  combined.score = like.score;
  combined.return_weights = like.return_weights;
  combined.precision = like.precision;
  absl::StatusOr<attn::OpResult> all =
      engine.ScaledDotProductAttention(combined);
  if (!all.ok()) return {};
  return SliceAttentionResults(*all, params, layout, in);
}

Results Combine(attn::Engine& engine,
                const std::vector<const attn::AdditiveAttentionRequest*>& members,
                CombinedWork* work) {
  std::vector<attn::AdditiveAttentionParams> params;
  for (const auto* r : members) {
    params.push_back(ParamsOf(*r));
  }
  const attn::AdditiveAttentionRequest& like = *members.front();
  const attn::AdditiveAttentionParams& first = params.front();
  const AttentionLayout layout{1, first.dq, first.dk, first.dv, false};
  const PaddedAttentionInputs in = PadAttentionInputs(params, layout, work);
  attn::AdditiveAttentionRequest combined;
  combined.queries = in.q.view();
  combined.keys = in.k.view();
  combined.values = in.v.view();
  combined.w_q = like.w_q;
  combined.w_k = like.w_k;
  combined.w_v = like.w_v;
  combined.valid_lens = in.lengths.view();
  combined.return_weights = like.return_weights;
  absl::StatusOr<attn::OpResult> all = engine.AdditiveAttention(combined);
  if (!all.ok()) return {};
  return SliceAttentionResults(*all, params, layout, in);
}

Results Combine(attn::Engine& engine,
                const std::vector<const attn::NadarayaWatsonRequest*>& members,
                CombinedWork* work) {
  std::vector<attn::NadarayaWatsonParams> params;
  int64_t total = 0;
  for (const auto* r : members) {
    params.push_back(ParamsOf(*r));
    total += params.back().n_query;
  }
  const attn::NadarayaWatsonRequest& like = *members.front();
  const int64_t dx = params.front().dx, dy = params.front().dy,
                n = params.front().n_train;
  const Staging::Staged queries = Staging::Get(
      0, like.x_query.rank() == 1 ? attn::Shape{total} : attn::Shape{total, dx},
      false);
  int64_t offset = 0;
  for (const auto& p : params) {
    CopyFloats(p.x_query, p.n_query * dx, queries.data() + offset * dx);
    work->useful_elements += p.n_query * n;
    offset += p.n_query;
  }
  work->computed_elements = total * n;
  attn::NadarayaWatsonRequest combined = like;
  combined.x_query = queries.view();
  absl::StatusOr<attn::OpResult> all = engine.NadarayaWatson(combined);
  if (!all.ok()) return {};
  Results results;
  offset = 0;
  for (const auto& p : params) {
    attn::OpResult result;
    result.implementation = all->implementation;
    result.output = SlicePadded(
        all->output, offset, p.n_query, 1, dy, 1, dy,
        like.y_train.rank() == 1 ? attn::Shape{p.n_query}
                                 : attn::Shape{p.n_query, dy});
    if (!all->weights.empty()) {
      result.weights = SlicePadded(all->weights, offset, p.n_query, 1, n, 1, n,
                                   {p.n_query, n});
    }
    offset += p.n_query;
    results.push_back(std::move(result));
  }
  return results;
}

Results Combine(attn::Engine& engine,
                const std::vector<const StoredRegressionRequest*>& members,
                CombinedWork* work) {
  std::vector<const attn::NadarayaWatsonRequest*> regressions;
  regressions.reserve(members.size());
  for (const auto* r : members) regressions.push_back(&r->regression);
  return Combine(engine, regressions, work);
}

// The result of attention against a memory in the call's own shape:
// [B, Lq, v] (and weights [B, Lq, N]) from the [1, B * Lq, ...] computed.
attn::OpResult InCallShape(attn::OpResult result,
                           const MemoryAttentionRequest& r) {
  result.output.shape = {r.batch, r.queries, result.output.shape.back()};
  if (!result.weights.empty()) {
    result.weights.shape = {r.batch, r.queries, result.weights.shape.back()};
  }
  return result;
}

Results Combine(attn::Engine& engine,
                const std::vector<const MemoryAttentionRequest*>& members,
                CombinedWork* work) {
  const attn::AttentionRequest& like = members.front()->attention;
  const int64_t d = like.queries.shape.back();
  const int64_t n = like.keys.shape[1];
  const int64_t dv = like.values.shape.back();
  int64_t total = 0;
  for (const auto* r : members) total += r->attention.queries.shape[1];
  const Staging::Staged queries = Staging::Get(0, {1, total, d}, false);
  int64_t offset = 0;
  for (const auto* r : members) {
    const int64_t rows = r->attention.queries.shape[1];
    CopyFloats(r->attention.queries.data, rows * d,
               queries.data() + offset * d);
    offset += rows;
  }
  work->computed_elements = total * n;
  work->useful_elements = total * n;
  attn::AttentionRequest combined = like;
  combined.queries = queries.view();
  absl::StatusOr<attn::OpResult> all = engine.ScaledDotProductAttention(combined);
  if (!all.ok()) return {};
  Results results;
  offset = 0;
  for (const auto* r : members) {
    const int64_t rows = r->attention.queries.shape[1];
    attn::OpResult result;
    result.implementation = all->implementation;
    result.output = SlicePadded(all->output, offset, rows, 1, dv, 1, dv,
                                {r->batch, r->queries, dv});
    if (!all->weights.empty()) {
      result.weights = SlicePadded(all->weights, offset, rows, 1, n, 1, n,
                                   {r->batch, r->queries, n});
    }
    offset += rows;
    results.push_back(std::move(result));
  }
  return results;
}

// A request's own score (or output) elements, for CombinedWork.
int64_t WorkElements(const attn::MaskedSoftmaxRequest& r) {
  const auto p = ParamsOf(r);
  return p.batch * p.rows * p.columns;
}
int64_t WorkElements(const attn::BatchMatmulRequest& r) {
  const auto p = ParamsOf(r);
  return p.n * p.m * p.p;
}
int64_t WorkElements(const attn::AttentionRequest& r) {
  const auto p = ParamsOf(r);
  return p.batch * p.heads * p.lq * p.lk;
}
int64_t WorkElements(const attn::AdditiveAttentionRequest& r) {
  const auto p = ParamsOf(r);
  return p.batch * p.lq * p.lk;
}
int64_t WorkElements(const attn::NadarayaWatsonRequest& r) {
  const auto p = ParamsOf(r);
  return p.n_query * p.n_train;
}
int64_t WorkElements(const MemoryAttentionRequest& r) {
  return WorkElements(r.attention);
}
int64_t WorkElements(const StoredRegressionRequest& r) {
  return WorkElements(r.regression);
}

// The members that share the first one's operands run as one call; the
// others, and all of them if that call fails, run alone.
template <typename Request>
Results RunClass(attn::Engine& engine,
                 absl::Span<const OperationRequest* const> requests,
                 CombinedWork* work) {
  const Request& first = std::get<Request>(*requests.front());
  std::vector<const Request*> together;
  std::vector<size_t> positions;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& request = std::get<Request>(*requests[i]);
    if (SharesOperands(first, request)) {
      together.push_back(&request);
      positions.push_back(i);
    }
  }
  Results results(requests.size(), absl::UnknownError("not run"));
  std::vector<bool> answered(requests.size(), false);
  if (together.size() > 1) {
    CombinedWork combined_work;
    Results combined = Combine(engine, together, &combined_work);
    Staging::Trim();
    if (!combined.empty()) {
      work->computed_elements += combined_work.computed_elements;
      work->useful_elements += combined_work.useful_elements;
      work->combined_requests = static_cast<int>(combined.size());
      for (size_t i = 0; i < combined.size(); ++i) {
        results[positions[i]] = std::move(combined[i]);
        answered[positions[i]] = true;
      }
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (answered[i]) continue;
    const Request& request = std::get<Request>(*requests[i]);
    results[i] = RunAlone(engine, *requests[i]);
    const int64_t elements = WorkElements(request);
    work->computed_elements += elements;
    work->useful_elements += elements;
  }
  work->in_combined_call = std::move(answered);
  return results;
}

}  // namespace

absl::StatusOr<BatchClass> ClassifyForBatching(const OperationRequest& request) {
  return std::visit([](const auto& r) { return Classify(r); }, request);
}

absl::StatusOr<attn::OpResult> RunAlone(attn::Engine& engine,
                                        const OperationRequest& request) {
  struct Visitor {
    attn::Engine& engine;
    auto operator()(const attn::MaskedSoftmaxRequest& r) {
      return engine.MaskedSoftmax(r);
    }
    auto operator()(const attn::BatchMatmulRequest& r) {
      return engine.BatchMatmul(r);
    }
    auto operator()(const attn::AttentionRequest& r) {
      return engine.ScaledDotProductAttention(r);
    }
    auto operator()(const attn::AdditiveAttentionRequest& r) {
      return engine.AdditiveAttention(r);
    }
    auto operator()(const attn::NadarayaWatsonRequest& r) {
      return engine.NadarayaWatson(r);
    }
    auto operator()(const StoredRegressionRequest& r) {
      return engine.NadarayaWatson(r.regression);
    }
    absl::StatusOr<attn::OpResult> operator()(const MemoryAttentionRequest& r) {
      absl::StatusOr<attn::OpResult> result =
          engine.ScaledDotProductAttention(r.attention);
      if (!result.ok()) return result;
      return InCallShape(*std::move(result), r);
    }
  };
  return std::visit(Visitor{engine}, request);
}

std::vector<absl::StatusOr<attn::OpResult>> RunTogether(
    attn::Engine& engine, absl::Span<const OperationRequest* const> requests,
    CombinedWork* work) {
  *work = CombinedWork{};
  if (requests.empty()) return {};
  return std::visit(
      [&](const auto& first) {
        using Request = std::decay_t<decltype(first)>;
        return RunClass<Request>(engine, requests, work);
      },
      *requests.front());
}

}  // namespace attnserve

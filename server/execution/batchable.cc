#include "server/execution/batchable.h"

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
#include "attn/pieces.h"
#include "attn/status_macros.h"
#include "attn/validate.h"
#include "server/execution/call_runner.h"

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

using Results = std::vector<absl::StatusOr<attn::OpResult>>;

// Every operation's batching rules (below).
template <typename Request>
struct Rules;

// A member's part of a combined result: the run's report, with tensors of
// its own to fill.
attn::OpResult PartOf(const attn::OpResult& all) {
  attn::OpResult part;
  part.implementation = all.implementation;
  part.backend = all.backend;
  return part;
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
    attn::OpResult result = PartOf(all);
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

// Rows stacked: requests that share every operand but their query rows
// (a regression's queries against one training set; any call on a stored
// version) run as one request over all the rows, and each takes its rows of
// the result back in its own shapes.

// The query rows of a library request: [1, rows, d] for attention (one batch
// entry), [rows] or [rows, dx] for the regression.
const attn::TensorView& QueryRows(const attn::AttentionRequest& r) {
  return r.queries;
}
attn::TensorView& QueryRows(attn::AttentionRequest& r) { return r.queries; }
const attn::TensorView& QueryRows(const attn::NadarayaWatsonRequest& r) {
  return r.x_query;
}
attn::TensorView& QueryRows(attn::NadarayaWatsonRequest& r) {
  return r.x_query;
}
int64_t RowAxis(const attn::TensorView& rows) {
  return rows.rank() == 1 ? 0 : rows.rank() - 2;
}
int64_t RowCount(const attn::TensorView& rows) {
  return rows.shape[RowAxis(rows)];
}

absl::StatusOr<attn::OpResult> RunLibrary(attn::Engine& engine,
                                          const attn::AttentionRequest& r) {
  return engine.ScaledDotProductAttention(r);
}
absl::StatusOr<attn::OpResult> RunLibrary(attn::Engine& engine,
                                          const attn::NadarayaWatsonRequest& r) {
  return engine.NadarayaWatson(r);
}

// One member of a stacked batch: its library request and the shapes it sees
// its rows of the result in.
template <typename LibraryRequest>
struct RowsMember {
  const LibraryRequest* request;
  attn::Shape output_shape;
  attn::Shape weights_shape;
  // A memory in pieces: the request over each (StoredRequest::pieces).
  // Null or empty: `request` alone.
  const std::vector<LibraryRequest>* pieces = nullptr;

  // The calls over its memory: its pieces', or its request alone.
  absl::Span<const LibraryRequest> calls() const {
    return pieces != nullptr && !pieces->empty()
               ? absl::Span<const LibraryRequest>(*pieces)
               : absl::Span<const LibraryRequest>(request, 1);
  }
};

// The number of keys a member's rows attend to: a stored memory's rows
// (versions of one lineage differ in it); 0 for a regression.
int64_t KeyRows(const attn::AttentionRequest& r) {
  return r.keys.rank() >= 2 ? r.keys.shape[r.keys.rank() - 2] : 0;
}
int64_t KeyRows(const attn::NadarayaWatsonRequest&) { return 0; }
template <typename LibraryRequest>
int64_t KeyRows(const RowsMember<LibraryRequest>& member) {
  int64_t keys = 0;
  for (const LibraryRequest& call : member.calls()) keys += KeyRows(call);
  return keys;
}

absl::StatusOr<attn::OpResult> RunCalls(
    attn::Engine& engine, absl::Span<const attn::AttentionRequest> calls) {
  return calls.size() == 1 ? RunLibrary(engine, calls.front())
                           : attn::AttendInPieces(engine, calls);
}

// The members' rows as one request to `like`'s operands; computed elements
// are useful ones (nothing is padded). Attention over versions of one
// lineage (server/execution/operation.h, StoredRequest) reads the newest
// member's keys, each member's rows masked to its own version's keys by
// per-row valid lengths, and each takes back its own weights' columns. A
// memory in pieces runs one such call per piece of the newest member's,
// each member's rows masked to the keys of its own version that piece
// holds (its rows are a prefix of the newest's), merged by log-sum-exp.
template <typename LibraryRequest>
Results StackRows(attn::Engine& engine,
                  const std::vector<RowsMember<LibraryRequest>>& members,
                  CombinedWork* work) {
  const RowsMember<LibraryRequest>* newest = &members.front();
  bool key_rows_differ = false;
  for (const auto& member : members) {
    const int64_t keys = KeyRows(member);
    key_rows_differ |= keys != KeyRows(*newest);
    if (keys > KeyRows(*newest)) newest = &member;
  }
  const LibraryRequest& like = *newest->request;
  const attn::TensorView& like_rows = QueryRows(like);
  int64_t total = 0;
  for (const auto& member : members) total += RowCount(QueryRows(*member.request));
  attn::Shape shape = like_rows.shape;
  shape[RowAxis(like_rows)] = total;
  const int64_t width = like_rows.rank() == 1 ? 1 : like_rows.shape.back();
  const Staging::Staged rows = Staging::Get(0, shape, false);
  int64_t offset = 0;
  for (const auto& member : members) {
    const attn::TensorView& own = QueryRows(*member.request);
    CopyFloats(own.data, RowCount(own) * width, rows.data() + offset * width);
    offset += RowCount(own);
  }
  std::vector<LibraryRequest> calls;
  std::vector<std::vector<int32_t>> key_limits;
  int64_t first_key = 0;  // the piece's first key in the newest memory
  for (const LibraryRequest& piece : newest->calls()) {
    LibraryRequest& call = calls.emplace_back(piece);
    QueryRows(call) = rows.view();
    if constexpr (std::is_same_v<LibraryRequest, attn::AttentionRequest>) {
      const int64_t piece_keys = KeyRows(piece);
      if (key_rows_differ) {
        std::vector<int32_t>& limits = key_limits.emplace_back();
        for (const auto& member : members) {
          limits.insert(limits.end(), RowCount(QueryRows(*member.request)),
                        static_cast<int32_t>(std::clamp<int64_t>(
                            KeyRows(member) - first_key, 0, piece_keys)));
        }
        call.valid_lens = attn::LengthsView{limits.data(), {1, total}};
      }
      first_key += piece_keys;
    }
  }
  absl::StatusOr<attn::OpResult> all;
  if constexpr (std::is_same_v<LibraryRequest, attn::AttentionRequest>) {
    all = RunCalls(engine, calls);
  } else {
    all = RunLibrary(engine, calls.front());
  }
  if (!all.ok()) return {};
  int64_t elements = 0;
  for (const LibraryRequest& call : calls) {
    elements += Rules<LibraryRequest>::WorkElements(call);
  }
  work->computed_elements = work->useful_elements = elements;
  const int64_t output_width =
      total > 0 ? static_cast<int64_t>(all->output.data.size()) / total : 0;
  const int64_t weights_width =
      total > 0 ? static_cast<int64_t>(all->weights.data.size()) / total : 0;
  Results results;
  offset = 0;
  for (const auto& member : members) {
    const int64_t count = RowCount(QueryRows(*member.request));
    attn::OpResult result = PartOf(*all);
    result.output = SlicePadded(all->output, offset, count, 1, output_width, 1,
                                output_width, member.output_shape);
    if (!all->weights.empty()) {
      // A member of an older version takes its own keys' columns.
      const int64_t own_width =
          key_rows_differ ? KeyRows(member) : weights_width;
      result.weights = SlicePadded(all->weights, offset, count, 1, own_width,
                                   1, weights_width, member.weights_shape);
    }
    offset += count;
    results.push_back(std::move(result));
  }
  return results;
}

// --- one set of rules per operation ---------------------------------------
//
// Rules<Request> says, for one kind of request: its class (Classify, given
// the wide engine, which decides whether a batch is worth every core),
// whether two members of a class may really share a call (SharesOperands:
// their hashed operands compared in full), how many score elements it is
// alone (WorkElements), and how members run as one call (Combine, empty
// when that call failed). A new operation is one more Rules.

struct NothingHashed {
  template <typename Request>
  static bool SharesOperands(const Request&, const Request&) {
    return true;
  }
};

template <>
struct Rules<attn::MaskedSoftmaxRequest> : NothingHashed {
  using Request = attn::MaskedSoftmaxRequest;
  static attn::MaskedSoftmaxParams ParamsOf(const Request& r) {
    return attn::ValidateMaskedSoftmax(r)->params;
  }
  static absl::StatusOr<BatchClass> Classify(const Request& r,
                                             const attn::Engine*) {
    ASSIGN_OR_RETURN(auto plan, attn::ValidateMaskedSoftmax(r));
    const auto& p = plan.params;
    return BatchClass{absl::StrCat("masked_softmax/", r.x.rank()),
                      p.batch * p.rows * p.columns};
  }
  static int64_t WorkElements(const Request& r) {
    const auto p = ParamsOf(r);
    return p.batch * p.rows * p.columns;
  }
  static Results Combine(attn::Engine& engine,
                           const std::vector<const Request*>& members,
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
      attn::OpResult result = PartOf(*all);
          result.output = SlicePadded(all->output, offset, p.batch, p.rows, p.columns,
                                  rows, columns, members[i]->x.shape);
      offset += p.batch;
      results.push_back(std::move(result));
    }
    return results;
  }
};

template <>
struct Rules<attn::BatchMatmulRequest> : NothingHashed {
  using Request = attn::BatchMatmulRequest;
  static attn::BatchMatmulParams ParamsOf(const Request& r) {
    return attn::ValidateBatchMatmulShapes(r)->params;
  }
  static absl::StatusOr<BatchClass> Classify(const Request& r,
                                             const attn::Engine*) {
    ASSIGN_OR_RETURN(auto plan, attn::ValidateBatchMatmul(r));
    const auto& p = plan.params;
    return BatchClass{absl::StrCat("batch_matmul/", p.k, "/", p.p, "/",
                                   static_cast<int>(p.precision)),
                      p.n * (p.m * p.k + p.k * p.p)};
  }
  static int64_t WorkElements(const Request& r) {
    const auto p = ParamsOf(r);
    return p.n * p.m * p.p;
  }
  static Results Combine(attn::Engine& engine,
                           const std::vector<const Request*>& members,
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
      attn::OpResult result = PartOf(*all);
          result.output = SlicePadded(all->output, offset, p.n, p.m, p_cols, m,
                                  p_cols, {p.n, p.m, p_cols});
      offset += p.n;
      results.push_back(std::move(result));
    }
    return results;
  }
};

// What attention requests must agree on to share a call, whatever holds
// their keys and values.
std::string AttentionKey(const attn::AttentionRequest& r,
                         const attn::AttentionParams& p) {
  return absl::StrCat("attention/", r.queries.rank(), "/", p.heads, "/", p.d,
                      "/", p.dv, "/", static_cast<int>(p.score), "/",
                      Bits(p.scale), "/", p.causal, "/",
                      static_cast<int>(p.precision), "/", r.return_weights);
}

template <>
struct Rules<attn::AttentionRequest> : NothingHashed {
  using Request = attn::AttentionRequest;
  static attn::AttentionParams ParamsOf(const Request& r) {
    return attn::ValidateAttentionShapes(r)->params;
  }
  static absl::StatusOr<BatchClass> Classify(const Request& r,
                                             const attn::Engine*) {
    ASSIGN_OR_RETURN(auto plan, attn::ValidateAttention(r));
    const auto& p = plan.params;
    return BatchClass{AttentionKey(r, p),
                      p.batch * p.heads * (p.lq * p.d + p.lk * (p.d + p.dv))};
  }
  static int64_t WorkElements(const Request& r) {
    const auto p = ParamsOf(r);
    return p.batch * p.heads * p.lq * p.lk;
  }
  static Results Combine(attn::Engine& engine,
                           const std::vector<const Request*>& members,
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
};

template <>
struct Rules<attn::AdditiveAttentionRequest> {
  using Request = attn::AdditiveAttentionRequest;
  static attn::AdditiveAttentionParams ParamsOf(const Request& r) {
    return attn::ValidateAdditiveAttention(r)->params;
  }
  static absl::StatusOr<BatchClass> Classify(const Request& r,
                                             const attn::Engine*) {
    ASSIGN_OR_RETURN(auto plan, attn::ValidateAdditiveAttention(r));
    const auto& p = plan.params;
    return BatchClass{
        absl::StrCat("additive/", p.dq, "/", p.dk, "/", p.h, "/", p.dv, "/",
                     r.return_weights, "/", ContentHash({r.w_q, r.w_k, r.w_v})),
        p.batch * (p.lq * p.dq + p.lk * (p.dk + p.dv))};
  }
  static bool SharesOperands(const Request& a, const Request& b) {
    return SameContents(a.w_q, b.w_q) && SameContents(a.w_k, b.w_k) &&
           SameContents(a.w_v, b.w_v);
  }
  static int64_t WorkElements(const Request& r) {
    const auto p = ParamsOf(r);
    return p.batch * p.lq * p.lk;
  }
  static Results Combine(attn::Engine& engine,
                           const std::vector<const Request*>& members,
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
};

// What regressions must agree on to share a call; `training_set` is what
// their x_train and y_train must be, their contents' hash or a stored
// version's identity.
std::string RegressionKey(const attn::NadarayaWatsonRequest& r,
                          const attn::NadarayaWatsonParams& p,
                          absl::string_view training_set) {
  return absl::StrCat("nadaraya_watson/", r.x_query.rank(), "/",
                      r.y_train.rank(), "/", p.dx, "/", p.dy, "/",
                      static_cast<int>(p.kernel), "/", Bits(p.bandwidth), "/",
                      r.return_weights, "/", training_set);
}

template <>
struct Rules<attn::NadarayaWatsonRequest> {
  using Request = attn::NadarayaWatsonRequest;
  static attn::NadarayaWatsonParams ParamsOf(const Request& r) {
    return attn::ValidateNadarayaWatson(r)->params;
  }
  static absl::StatusOr<BatchClass> Classify(const Request& r,
                                             const attn::Engine*) {
    ASSIGN_OR_RETURN(auto plan, attn::ValidateNadarayaWatson(r));
    const auto& p = plan.params;
    return BatchClass{
        RegressionKey(r, p, absl::StrCat(ContentHash({r.x_train, r.y_train}))),
        p.n_query * p.dx};
  }
  static bool SharesOperands(const Request& a, const Request& b) {
    return SameContents(a.x_train, b.x_train) &&
           SameContents(a.y_train, b.y_train);
  }
  static int64_t WorkElements(const Request& r) {
    const auto p = ParamsOf(r);
    return p.n_query * p.n_train;
  }
  // The queries concatenated; each member's rows come back in the shapes
  // the library gives its call alone.
  static Results Combine(attn::Engine& engine,
                         const std::vector<const Request*>& members,
                         CombinedWork* work) {
    std::vector<RowsMember<Request>> rows;
    for (const Request* r : members) {
      attn::ResultSize size = attn::SizeOfResult(*r).value();  // classified
      rows.push_back({r, std::move(size.output_shape),
                      std::move(size.weights_shape)});
    }
    return StackRows(engine, rows, work);
  }
};

// A call on a stored version: its class is the version itself, by identity
// (never hashed: it may hold gigabytes), and what its library request must
// agree on; the rows are stacked, so a batch reads the version once. A batch
// of attention over keys the wide engine spreads across its threads is
// worth every core.
template <>
struct Rules<StoredRequest> : NothingHashed {
  using Request = StoredRequest;
  static absl::StatusOr<BatchClass> Classify(const Request& r,
                                             const attn::Engine* wide_engine) {
    const std::string version =
        absl::StrCat("stored/", reinterpret_cast<uintptr_t>(r.version));
    // Attention over a memory that grows is classed by its lineage, so the
    // calls on its successive versions share a batch (StackRows masks
    // each to its own rows); calls with masks of their own never are.
    const std::string lineage =
        r.lineage == nullptr
            ? version
            : absl::StrCat("lineage/", reinterpret_cast<uintptr_t>(r.lineage));
    struct Visitor {
      const std::string& version;
      const std::string& lineage;
      const attn::Engine* wide_engine;
      const std::vector<attn::AttentionRequest>& pieces;
      absl::StatusOr<BatchClass> operator()(const attn::AttentionRequest& a) {
        ASSIGN_OR_RETURN(auto plan, attn::ValidateAttention(a));
        const bool by_lineage = !a.valid_lens.present() && !a.causal;
        // Worth every core when its memory, or any piece of it, is (the
        // first piece of a grown memory may be a few rows).
        bool wide = false;
        for (const attn::AttentionRequest& call :
             pieces.empty() ? absl::MakeConstSpan(&a, 1)
                            : absl::MakeConstSpan(pieces)) {
          wide |= wide_engine != nullptr &&
                  wide_engine->SpreadsKeysAcrossThreads(call);
        }
        return BatchClass{absl::StrCat(by_lineage ? lineage : version, "/",
                                       AttentionKey(a, plan.params)),
                          a.queries.num_elements(), wide};
      }
      absl::StatusOr<BatchClass> operator()(
          const attn::NadarayaWatsonRequest& n) {
        ASSIGN_OR_RETURN(auto plan, attn::ValidateNadarayaWatson(n));
        const auto& p = plan.params;
        return BatchClass{RegressionKey(n, p, version), p.n_query * p.dx};
      }
    };
    return std::visit(Visitor{version, lineage, wide_engine, r.pieces},
                      r.request);
  }
  static int64_t WorkElements(const Request& r) {
    int64_t elements = 0;
    for (const attn::AttentionRequest& piece : r.pieces) {
      elements += Rules<attn::AttentionRequest>::WorkElements(piece);
    }
    if (!r.pieces.empty()) return elements;
    return std::visit(
        [](const auto& library) {
          return Rules<std::decay_t<decltype(library)>>::WorkElements(library);
        },
        r.request);
  }
  static Results Combine(attn::Engine& engine,
                         const std::vector<const Request*>& members,
                         CombinedWork* work) {
    return std::visit(
        [&](const auto& like) {
          using LibraryRequest = std::decay_t<decltype(like)>;
          std::vector<RowsMember<LibraryRequest>> rows;
          for (const Request* r : members) {
            RowsMember<LibraryRequest>& member =
                rows.emplace_back(RowsMember<LibraryRequest>{
                    &std::get<LibraryRequest>(r->request), r->output_shape,
                    r->weights_shape});
            if constexpr (std::is_same_v<LibraryRequest,
                                         attn::AttentionRequest>) {
              member.pieces = &r->pieces;
            }
          }
          return StackRows(engine, rows, work);
        },
        members.front()->request);
  }
};

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
    if (Rules<Request>::SharesOperands(first, request)) {
      together.push_back(&request);
      positions.push_back(i);
    }
  }
  Results results(requests.size(), absl::UnknownError("not run"));
  std::vector<bool> answered(requests.size(), false);
  if (together.size() > 1) {
    CombinedWork combined_work;
    Results combined = Rules<Request>::Combine(engine, together, &combined_work);
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
    results[i] = RunAlone(engine, *requests[i]);
    const int64_t elements =
        Rules<Request>::WorkElements(std::get<Request>(*requests[i]));
    work->computed_elements += elements;
    work->useful_elements += elements;
  }
  work->in_combined_call = std::move(answered);
  return results;
}

}  // namespace

absl::StatusOr<BatchClass> ClassifyForBatching(
    const OperationRequest& request, const attn::Engine* wide_engine) {
  return std::visit(
      [wide_engine](const auto& r) {
        return Rules<std::decay_t<decltype(r)>>::Classify(r, wide_engine);
      },
      request);
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

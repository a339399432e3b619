#include "attn/internal/cpu/onednn_primitives.h"

#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"

namespace attn::internal {
namespace {

enum class PrimitiveKind : int64_t { kMatmul, kSoftmax };

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

}  // namespace

OneDnnPrimitives::OneDnnPrimitives(dnnl::engine engine, int capacity)
    : engine_(std::move(engine)), capacity_(capacity) {}

template <typename Make>
absl::StatusOr<OneDnnPrimitives::Cached> OneDnnPrimitives::GetOrCreate(
    const Key& key, const Make& make) {
  absl::MutexLock lock(&mu_);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  Cached primitive;
  try {
    primitive = make();
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("oneDNN primitive creation failed: ", e.what()));
  }
  if (static_cast<int>(cache_.size()) >= capacity_) {
    cache_.erase(insertion_order_.front());
    insertion_order_.pop_front();
  }
  cache_.emplace(key, primitive);
  insertion_order_.push_back(key);
  return primitive;
}

absl::Status OneDnnPrimitives::Matmul(const float* a, const float* b, float* c,
                                      int64_t n, int64_t m, int64_t k,
                                      int64_t p) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const dnnl::memory::desc a_md({n, m, k}, dt::f32, tag::abc);
  const dnnl::memory::desc b_md({n, k, p}, dt::f32, tag::abc);
  const dnnl::memory::desc c_md({n, m, p}, dt::f32, tag::abc);
  ASSIGN_OR_RETURN(
      Cached matmul,
      GetOrCreate({static_cast<int64_t>(PrimitiveKind::kMatmul), n, m, k, p},
                  [&] {
                    const dnnl::matmul::primitive_desc pd(
                        dnnl::matmul::desc(a_md, b_md, c_md), UserScratchpad(),
                        engine_);
                    return Cached{dnnl::matmul(pd), pd.scratchpad_desc()};
                  }));
  return Execute(matmul, {{DNNL_ARG_SRC, {a_md, a}},
                          {DNNL_ARG_WEIGHTS, {b_md, b}},
                          {DNNL_ARG_DST, {c_md, c}}});
}

absl::Status OneDnnPrimitives::Softmax(const float* x, float* y, int64_t rows,
                                       int64_t columns) {
  const dnnl::memory::desc md({rows, columns}, dnnl::memory::data_type::f32,
                              dnnl::memory::format_tag::ab);
  ASSIGN_OR_RETURN(
      Cached softmax,
      GetOrCreate(
          {static_cast<int64_t>(PrimitiveKind::kSoftmax), rows, columns, 0, 0},
          [&] {
            const dnnl::softmax_forward::primitive_desc pd(
                dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference,
                                            md, 1),
                UserScratchpad(), engine_);
            return Cached{dnnl::softmax_forward(pd), pd.scratchpad_desc()};
          }));
  return Execute(softmax, {{DNNL_ARG_SRC, {md, x}}, {DNNL_ARG_DST, {md, y}}});
}

absl::Status OneDnnPrimitives::Execute(
    const Cached& cached,
    const std::vector<std::pair<int, Argument>>& arguments) {
  try {
    dnnl::stream stream(engine_);
    std::unordered_map<int, dnnl::memory> memories;
    for (const auto& [slot, argument] : arguments) {
      // oneDNN takes a non-const handle even for inputs; it never writes
      // to source or weights memory.
      memories.emplace(slot, dnnl::memory(argument.desc, engine_,
                                          const_cast<float*>(argument.data)));
    }
    // This thread's own scratchpad, kept between calls (a call runs on
    // one thread; oneDNN's OpenMP threads share it within the call).
    if (const size_t bytes = cached.scratchpad.get_size(); bytes > 0) {
      constexpr size_t kAlignment = 64;
      thread_local std::vector<char> scratchpad;
      if (scratchpad.size() < bytes + kAlignment) {
        scratchpad.resize(bytes + kAlignment);
      }
      void* aligned = scratchpad.data();
      size_t space = scratchpad.size();
      std::align(kAlignment, bytes, aligned, space);
      memories.emplace(DNNL_ARG_SCRATCHPAD,
                       dnnl::memory(cached.scratchpad, engine_, aligned));
    }
    cached.primitive.execute(stream, memories);
    stream.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("oneDNN execution failed: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace attn::internal

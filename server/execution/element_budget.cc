#include "server/execution/element_budget.h"

#include "absl/strings/str_cat.h"

namespace attnserve {

absl::Status ElementBudget::Take(absl::string_view field, int64_t elements) {
  remaining_ -= elements;
  if (remaining_ < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ": the request's tensors exceed the limit of ", limit_,
        " elements per request (--max_request_elements)"));
  }
  return absl::OkStatus();
}

}  // namespace attnserve

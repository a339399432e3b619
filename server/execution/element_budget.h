// The elements one request may bring, and what its call weighs in flight.
//
// Thread-compatible: one per call, used on one thread at a time.
#ifndef ATTNSERVE_SERVER_EXECUTION_ELEMENT_BUDGET_H_
#define ATTNSERVE_SERVER_EXECUTION_ELEMENT_BUDGET_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attnserve {

// Counts the elements of every tensor one request decodes against a limit
// (--max_request_elements), and the elements of its result once they are
// known: together, the call's payload (server/execution/admission.h charges it).
class ElementBudget {
 public:
  explicit ElementBudget(int64_t limit) : remaining_(limit), limit_(limit) {}
  // RESOURCE_EXHAUSTED naming `field` once the request's tensors together
  // exceed the limit.
  absl::Status Take(absl::string_view field, int64_t elements);
  void CountResult(int64_t elements) { result_elements_ += elements; }

  // The request's decoded elements and the result's counted ones.
  int64_t payload_elements() const {
    return (limit_ - remaining_) + result_elements_;
  }

 private:
  int64_t remaining_;
  const int64_t limit_;
  int64_t result_elements_ = 0;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_EXECUTION_ELEMENT_BUDGET_H_

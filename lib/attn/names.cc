#include "attn/ops.h"
#include "attn/params.h"

namespace attn {

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFloat32:
      return "fp32";
    case Precision::kBFloat16:
      return "bf16";
    case Precision::kFloat16:
      return "fp16";
  }
  return "unknown";
}

const char* RegressionKernelName(RegressionKernel kernel) {
  switch (kernel) {
    case RegressionKernel::kGaussian:
      return "gaussian";
    case RegressionKernel::kBoxcar:
      return "boxcar";
    case RegressionKernel::kConstant:
      return "constant";
    case RegressionKernel::kEpanechnikov:
      return "epanechnikov";
  }
  return "unknown";
}

}  // namespace attn

// One pass over each CPU gradient: multiply by 1/scale in place and OR together whether
// any result is inf or nan. Built on first use by paddle_amp_scaler/fused_cpu.py.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include "paddle/extension.h"

// Below this many elements a parallel region costs more than it saves (and stalls when
// the other cores are busy), so small tensors run on one thread, still vectorised.
constexpr int64_t kParallelFrom = 1 << 16;

// Exponent bits all set <=> inf or nan. Testing bits keeps the loop branch-free, so it
// vectorises; an OR-reduction is exact and order-independent.
template <typename T, typename Bits, Bits kExponent>
static bool UnscaleInPlace(T* data, int64_t n, T inverse) {
  Bits nonfinite = 0;
#pragma omp parallel for simd reduction(| : nonfinite) schedule(static) if (n >= kParallelFrom)
  for (int64_t i = 0; i < n; ++i) {
    const T value = data[i] * inverse;
    data[i] = value;
    Bits bits;
    std::memcpy(&bits, &value, sizeof(bits));
    nonfinite |= static_cast<Bits>((bits & kExponent) == kExponent);
  }
  return nonfinite != 0;
}

std::vector<paddle::Tensor> UnscaleAndCheck(const std::vector<paddle::Tensor>& xs,
                                            const paddle::Tensor& scale) {
  bool found = false;
  for (const auto& x : xs) {
    auto& grad = const_cast<paddle::Tensor&>(x);
    if (grad.dtype() == paddle::DataType::FLOAT64) {
      found |= UnscaleInPlace<double, uint64_t, 0x7ff0000000000000ULL>(
          grad.data<double>(), grad.numel(), 1.0 / scale.data<double>()[0]);
    } else {
      found |= UnscaleInPlace<float, uint32_t, 0x7f800000U>(
          grad.data<float>(), grad.numel(), 1.0f / scale.data<float>()[0]);
    }
  }
  return {paddle::full({1}, found, paddle::DataType::BOOL, paddle::CPUPlace())};
}

PD_BUILD_OP(fused_unscale_and_check)
    .Inputs({paddle::Vec("X"), "Scale"})
    .Outputs({"FoundInf"})
    .SetKernelFn(PD_KERNEL(UnscaleAndCheck));

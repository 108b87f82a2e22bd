// One pass over CPU gradients: multiply by 1/scale in place and OR together whether any
// result is inf or nan. Built on first use by paddle_amp_scaler/fused_cpu.py.
//
// Single-threaded on purpose: Paddle sets OMP_NUM_THREADS=1 and runs its own CPU
// kernels on one thread, and a second OpenMP runtime beside Paddle's bundled one makes
// both spin against each other (calls stalling for tens of milliseconds on a busy
// machine). One vectorised pass is already bound by memory bandwidth.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#include "paddle/extension.h"

namespace {

// Exponent bits all set <=> inf or nan. Testing bits keeps the loop branch-free, so it
// vectorises; an OR-reduction is exact and order-independent.
template <typename T, typename Bits, Bits kExponent>
inline bool UnscaleAll(const std::vector<paddle::Tensor>& xs, T inverse) {
  Bits nonfinite = 0;
  for (const auto& x : xs) {
    T* data = const_cast<paddle::Tensor&>(x).data<T>();
    const int64_t n = x.numel();
#pragma omp simd reduction(| : nonfinite)
    for (int64_t i = 0; i < n; ++i) {
      const T value = data[i] * inverse;
      data[i] = value;
      Bits bits;
      std::memcpy(&bits, &value, sizeof(bits));
      nonfinite |= static_cast<Bits>((bits & kExponent) == kExponent);
    }
  }
  return nonfinite != 0;
}

// An AVX2 and a baseline copy of each, chosen when the library loads by the CPU it runs
// on: the build cache may be shared by machines of different generations.
__attribute__((target_clones("avx2", "default"))) bool UnscaleAllFloat(
    const std::vector<paddle::Tensor>& xs, float inverse) {
  return UnscaleAll<float, uint32_t, 0x7f800000U>(xs, inverse);
}

__attribute__((target_clones("avx2", "default"))) bool UnscaleAllDouble(
    const std::vector<paddle::Tensor>& xs, double inverse) {
  return UnscaleAll<double, uint64_t, 0x7ff0000000000000ULL>(xs, inverse);
}

// The same pass, also counting each tensor's inf and nan elements as backward left
// them (before the multiply) into tally[2k], tally[2k + 1]. Without its sign bit an
// inf is exactly the exponent mask and a nan is above it; compared as signed integers
// (the sign is cleared) these are two vector compares. The counters have the element's
// width, so that the loop vectorises as the plain one does; chunks keep them from
// wrapping.
template <typename T, typename Bits, Bits kExponent>
inline bool UnscaleAndTallyAll(const std::vector<paddle::Tensor>& xs, T inverse,
                               int64_t* tally) {
  using Signed = std::make_signed_t<Bits>;
  constexpr Bits kMagnitude = ~Bits{0} >> 1;
  constexpr int64_t kChunk = int64_t{1} << 30;
  Bits nonfinite = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    T* data = const_cast<paddle::Tensor&>(xs[k]).data<T>();
    const int64_t n = xs[k].numel();
    int64_t infs = 0, nans = 0;
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t end = std::min(n, start + kChunk);
      Bits chunk_infs = 0, chunk_nans = 0;
      // No `omp simd` here: with it GCC 12 leaves this loop scalar in the AVX2 clone
      // (three times slower); integer reductions vectorise without it.
      for (int64_t i = start; i < end; ++i) {
        Bits raw;
        std::memcpy(&raw, &data[i], sizeof(raw));
        const Signed magnitude = static_cast<Signed>(raw & kMagnitude);
        chunk_infs += static_cast<Bits>(magnitude == static_cast<Signed>(kExponent));
        chunk_nans += static_cast<Bits>(magnitude > static_cast<Signed>(kExponent));
        const T value = data[i] * inverse;
        data[i] = value;
        Bits bits;
        std::memcpy(&bits, &value, sizeof(bits));
        nonfinite |= static_cast<Bits>((bits & kExponent) == kExponent);
      }
      infs += chunk_infs;
      nans += chunk_nans;
    }
    tally[2 * k] = infs;
    tally[2 * k + 1] = nans;
  }
  return nonfinite != 0;
}

__attribute__((target_clones("avx2", "default"))) bool UnscaleAndTallyAllFloat(
    const std::vector<paddle::Tensor>& xs, float inverse, int64_t* tally) {
  return UnscaleAndTallyAll<float, uint32_t, 0x7f800000U>(xs, inverse, tally);
}

__attribute__((target_clones("avx2", "default"))) bool UnscaleAndTallyAllDouble(
    const std::vector<paddle::Tensor>& xs, double inverse, int64_t* tally) {
  return UnscaleAndTallyAll<double, uint64_t, 0x7ff0000000000000ULL>(xs, inverse, tally);
}

// A bool [1] tensor holding `found`. paddle::empty and a store, not paddle::full: full
// dispatches a Paddle kernel, whose code costs tens of microseconds when a training step
// has just pushed it out of the CPU's caches.
paddle::Tensor FlagOf(bool found) {
  paddle::Tensor flag = paddle::empty({1}, paddle::DataType::BOOL, paddle::CPUPlace());
  flag.data<bool>()[0] = found;
  return flag;
}

}  // namespace

// All of `xs` share one dtype, float32 or float64, and `scale` has that dtype too.
paddle::Tensor Unscale(const std::vector<paddle::Tensor>& xs, const paddle::Tensor& scale) {
  bool found = false;
  if (!xs.empty()) {
    if (xs[0].dtype() == paddle::DataType::FLOAT64) {
      found = UnscaleAllDouble(xs, 1.0 / scale.data<double>()[0]);
    } else {
      found = UnscaleAllFloat(xs, 1.0f / scale.data<float>()[0]);
    }
  }
  return FlagOf(found);
}

std::vector<paddle::Tensor> UnscaleAndCheck(const std::vector<paddle::Tensor>& xs,
                                            const paddle::Tensor& scale) {
  return {Unscale(xs, scale)};
}

PD_BUILD_OP(fused_unscale_and_check)
    .Inputs({paddle::Vec("X"), "Scale"})
    .Outputs({"FoundInf"})
    .SetKernelFn(PD_KERNEL(UnscaleAndCheck));

// The statistics of one iteration, in one call instead of six small Paddle operations:
// `row` is statistics.py's [skipped, skip_streak, since_skip, growths, backoffs, 1];
// the update rule changed the scale when it reset the counter of this iteration's
// kind. statistics.py's transition matrices say the same for other devices.
paddle::Tensor Count(const paddle::Tensor& row, const paddle::Tensor& found,
                     const paddle::Tensor& incr_count, const paddle::Tensor& decr_count,
                     bool dynamic) {
  enum { kSkipped, kStreak, kSinceSkip, kGrowths, kBackoffs };
  // Copied by hand for the reason FlagOf gives.
  paddle::Tensor out = paddle::empty(row.shape(), paddle::DataType::FLOAT64, paddle::CPUPlace());
  double* counts = out.data<double>();
  std::memcpy(counts, row.data<double>(), sizeof(double) * row.numel());
  const bool skipped = found.data<bool>()[0];
  const int32_t rule_counter = skipped ? decr_count.data<int32_t>()[0]
                                       : incr_count.data<int32_t>()[0];
  const bool changed = dynamic && rule_counter == 0;
  if (skipped) {
    counts[kSkipped] += 1;
    counts[kStreak] += 1;
    counts[kSinceSkip] = 0;
    counts[kBackoffs] += changed;
  } else {
    counts[kStreak] = 0;
    counts[kSinceSkip] += 1;
    counts[kGrowths] += changed;
  }
  return out;
}

std::vector<paddle::Tensor> CountIteration(const paddle::Tensor& row,
                                           const paddle::Tensor& found,
                                           const paddle::Tensor& incr_count,
                                           const paddle::Tensor& decr_count,
                                           bool dynamic) {
  return {Count(row, found, incr_count, decr_count, dynamic)};
}

// The previous iteration's count and this iteration's unscale in one call: on a CPU
// each call costs microseconds of dispatch, whatever it does.
std::vector<paddle::Tensor> UnscaleCheckAndCount(const std::vector<paddle::Tensor>& xs,
                                                 const paddle::Tensor& scale,
                                                 const paddle::Tensor& row,
                                                 const paddle::Tensor& found,
                                                 const paddle::Tensor& incr_count,
                                                 const paddle::Tensor& decr_count,
                                                 bool dynamic) {
  paddle::Tensor counted = Count(row, found, incr_count, decr_count, dynamic);
  return {Unscale(xs, scale), counted};
}

PD_BUILD_OP(fused_unscale_check_and_count)
    .Inputs({paddle::Vec("X"), "Scale", "Row", "Found", "IncrCount", "DecrCount"})
    .Outputs({"FoundInf", "RowOut"})
    .Attrs({"dynamic: bool"})
    .SetKernelFn(PD_KERNEL(UnscaleCheckAndCount));

PD_BUILD_OP(fused_count_iteration)
    .Inputs({"Row", "Found", "IncrCount", "DecrCount"})
    .Outputs({"Out"})
    .Attrs({"dynamic: bool"})
    .SetKernelFn(PD_KERNEL(CountIteration));

// An unscale that also counts inf and nan per tensor, for overflow_report.py: Tally is
// int64 [len(X), 2], (infs, nans) of each tensor before it was unscaled.
std::vector<paddle::Tensor> UnscaleCheckAndTally(const std::vector<paddle::Tensor>& xs,
                                                 const paddle::Tensor& scale) {
  const int64_t count = static_cast<int64_t>(xs.size());
  // Every entry is written below.
  paddle::Tensor tally = paddle::empty({count, 2}, paddle::DataType::INT64, paddle::CPUPlace());
  bool found = false;
  if (!xs.empty()) {
    int64_t* counts = tally.data<int64_t>();
    if (xs[0].dtype() == paddle::DataType::FLOAT64) {
      found = UnscaleAndTallyAllDouble(xs, 1.0 / scale.data<double>()[0], counts);
    } else {
      found = UnscaleAndTallyAllFloat(xs, 1.0f / scale.data<float>()[0], counts);
    }
  }
  return {FlagOf(found), tally};
}

PD_BUILD_OP(fused_unscale_check_and_tally)
    .Inputs({paddle::Vec("X"), "Scale"})
    .Outputs({"FoundInf", "Tally"})
    .SetKernelFn(PD_KERNEL(UnscaleCheckAndTally));

// The scaler's CPU work in compiled code: unscale-and-check in one pass, the update rule,
// the statistics count and the skip of a plain SGD step. Built on first use by
// paddle_amp_scaler/core/fused_cpu.py.
//
// A Python extension module (pybind11), not a Paddle custom operator: a custom operator
// runs Paddle's operator machinery on every call (infer-shape and infer-dtype, AMP
// casting, autograd checks), and right after an optimizer step has pushed that code out of
// the CPU's caches one call costs over 100 us, more than the pass itself. A function
// taking paddle::Tensor arguments costs a few microseconds. Everything here runs at once
// on host memory, like every Paddle CPU kernel, and writes in place or into tensors the
// caller holds: a step allocates only the found-inf flag.
//
// Single-threaded on purpose: Paddle sets OMP_NUM_THREADS=1 and runs its own CPU
// kernels on one thread, and a second OpenMP runtime beside Paddle's bundled one makes
// both spin against each other (calls stalling for tens of milliseconds on a busy
// machine). One vectorised pass is already bound by memory bandwidth.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "paddle/extension.h"
#include "paddle/utils/pybind.h"

namespace {

using Tensors = std::vector<paddle::Tensor>;

// Exponent bits all set <=> inf or nan, and no value has more of them: the largest
// masked exponent decides. A max-reduction over integers vectorises on every x86 level,
// and it is exact and order-independent.
template <typename T, typename Bits, Bits kExponent>
inline Bits UnscaleOne(T* data, int64_t n, T inverse) {
  Bits largest = 0;
#pragma omp simd reduction(max : largest)
  for (int64_t i = 0; i < n; ++i) {
    const T value = data[i] * inverse;
    data[i] = value;
    Bits bits;
    std::memcpy(&bits, &value, sizeof(bits));
    const Bits exponent = bits & kExponent;
    largest = exponent > largest ? exponent : largest;
  }
  return largest;
}

// An AVX-512, an AVX2 and a baseline copy of each, chosen when the library loads by the
// CPU it runs on: the build cache may be shared by machines of different generations.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) bool UnscaleFloat(
    float* data, int64_t n, float inverse) {
  return UnscaleOne<float, uint32_t, 0x7f800000U>(data, n, inverse) == 0x7f800000U;
}

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) bool UnscaleDouble(
    double* data, int64_t n, double inverse) {
  return UnscaleOne<double, uint64_t, 0x7ff0000000000000ULL>(data, n, inverse) ==
         0x7ff0000000000000ULL;
}

// The same pass, also measuring the largest finite magnitude as backward left it (the
// headroom policy's amax). Without the sign bit, floats order as their bits do, and inf
// and nan are exactly those at or above the exponent mask: two more max-reductions of
// integers. Signed ones: with the sign bit clear they order alike, and AVX2 has a signed
// compare but no unsigned one (an unsigned max here ran at half the speed). No `omp
// simd`, as in the tally below: with it GCC 12 leaves this loop scalar in the AVX2 clone
// (three times slower), and integer reductions vectorise without it.
template <typename T, typename Bits, Bits kExponent>
inline bool UnscaleAndMeasureOne(T* data, int64_t n, T inverse, Bits* largest_finite) {
  using Signed = std::make_signed_t<Bits>;
  constexpr Bits kMagnitude = ~Bits{0} >> 1;
  constexpr Signed kLimit = static_cast<Signed>(kExponent);
  Signed exponent_max = 0, finite_max = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits raw;
    std::memcpy(&raw, &data[i], sizeof(raw));
    const Signed magnitude = static_cast<Signed>(raw & kMagnitude);
    const Signed finite_magnitude = magnitude < kLimit ? magnitude : 0;
    finite_max = finite_magnitude > finite_max ? finite_magnitude : finite_max;
    const T value = data[i] * inverse;
    data[i] = value;
    Bits bits;
    std::memcpy(&bits, &value, sizeof(bits));
    const Signed exponent = static_cast<Signed>(bits & kExponent);
    exponent_max = exponent > exponent_max ? exponent : exponent_max;
  }
  *largest_finite = static_cast<Bits>(finite_max);
  return exponent_max == kLimit;
}

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) bool MeasureFloat(
    float* data, int64_t n, float inverse, float* amax) {
  uint32_t bits = 0;
  const bool found = UnscaleAndMeasureOne<float, uint32_t, 0x7f800000U>(data, n, inverse, &bits);
  std::memcpy(amax, &bits, sizeof(bits));
  return found;
}

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) bool MeasureDouble(
    double* data, int64_t n, double inverse, float* amax) {
  uint64_t bits = 0;
  const bool found =
      UnscaleAndMeasureOne<double, uint64_t, 0x7ff0000000000000ULL>(data, n, inverse, &bits);
  double largest;
  std::memcpy(&largest, &bits, sizeof(bits));
  // Rounded as Paddle's cast rounds a float64 amax on the other path.
  *amax = static_cast<float>(largest);
  return found;
}

// The same pass, also counting the tensor's inf and nan elements as backward left them
// (before the multiply). Without its sign bit an inf is exactly the exponent mask and a
// nan is above it; compared as signed integers (the sign is cleared) these are two
// vector compares. The counters have the element's width, so that the loop vectorises
// as the plain one does; chunks keep them from wrapping. The largest finite magnitude
// (the amax) comes out too: the overflow report and the headroom policy may both be on.
template <typename T, typename Bits, Bits kExponent>
inline bool UnscaleAndTallyOne(T* data, int64_t n, T inverse, int64_t* infs_out,
                               int64_t* nans_out, Bits* largest_finite) {
  using Signed = std::make_signed_t<Bits>;
  constexpr Bits kMagnitude = ~Bits{0} >> 1;
  constexpr int64_t kChunk = int64_t{1} << 30;
  Bits nonfinite = 0;
  Signed finite_max = 0;
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
      const Signed finite_magnitude = magnitude < static_cast<Signed>(kExponent) ? magnitude : 0;
      finite_max = finite_magnitude > finite_max ? finite_magnitude : finite_max;
      const T value = data[i] * inverse;
      data[i] = value;
      Bits bits;
      std::memcpy(&bits, &value, sizeof(bits));
      nonfinite |= static_cast<Bits>((bits & kExponent) == kExponent);
    }
    infs += chunk_infs;
    nans += chunk_nans;
  }
  *infs_out = infs;
  *nans_out = nans;
  *largest_finite = static_cast<Bits>(finite_max);
  return nonfinite != 0;
}

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) bool TallyFloat(
    float* data, int64_t n, float inverse, int64_t* infs, int64_t* nans, float* amax) {
  uint32_t bits = 0;
  const bool found =
      UnscaleAndTallyOne<float, uint32_t, 0x7f800000U>(data, n, inverse, infs, nans, &bits);
  std::memcpy(amax, &bits, sizeof(bits));
  return found;
}

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) bool TallyDouble(
    double* data, int64_t n, double inverse, int64_t* infs, int64_t* nans, float* amax) {
  uint64_t bits = 0;
  const bool found = UnscaleAndTallyOne<double, uint64_t, 0x7ff0000000000000ULL>(
      data, n, inverse, infs, nans, &bits);
  double largest;
  std::memcpy(&largest, &bits, sizeof(bits));
  *amax = static_cast<float>(largest);
  return found;
}

bool IsFloat64(const paddle::Tensor& x) { return x.dtype() == paddle::DataType::FLOAT64; }

// Every tensor is checked before any is written, so that a refused call changes nothing.
// pybind11 turns std::invalid_argument into ValueError.
void RequireFloatsOnCpu(const Tensors& xs, const char* what) {
  for (const auto& x : xs) {
    const bool float_dtype = x.dtype() == paddle::DataType::FLOAT32 || IsFloat64(x);
    if (!float_dtype || !x.is_cpu() || !x.is_dense_tensor()) {
      throw std::invalid_argument(std::string(what) +
                                  " takes dense float32 or float64 CPU tensors, got one of "
                                  "dtype " + phi::DataTypeToString(x.dtype()) + " on " +
                                  x.place().DebugString());
    }
  }
}

// The scale is float32 (float64 where a caller holds one); float64 gradients take its
// inverse in float64, as Paddle's kernel does once the scale is cast to float64.
double ScaleOf(const paddle::Tensor& scale) {
  return IsFloat64(scale) ? scale.data<double>()[0] : scale.data<float>()[0];
}

paddle::Tensor FlagOf(bool found) {
  paddle::Tensor flag = paddle::empty({1}, paddle::DataType::BOOL, paddle::CPUPlace());
  flag.data<bool>()[0] = found;
  return flag;
}

paddle::Tensor FloatOf(float value) {
  paddle::Tensor number = paddle::empty({1}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  number.data<float>()[0] = value;
  return number;
}

}  // namespace

// Multiplies every tensor of `xs` (float32 and float64 may mix) in place by 1/scale and
// returns whether any result is inf or nan: as a bool [1] tensor, and as the host value it
// already is here (on a CPU there is no device to wait for).
std::tuple<paddle::Tensor, bool> UnscaleAndCheck(const Tensors& xs,
                                                 const paddle::Tensor& scale) {
  RequireFloatsOnCpu(xs, "unscale_and_check");
  const double scale_value = ScaleOf(scale);
  const float inverse_float = 1.0f / static_cast<float>(scale_value);
  const double inverse_double = 1.0 / scale_value;
  bool found = false;
  for (const auto& x : xs) {
    auto& tensor = const_cast<paddle::Tensor&>(x);
    found |= IsFloat64(x) ? UnscaleDouble(tensor.data<double>(), x.numel(), inverse_double)
                          : UnscaleFloat(tensor.data<float>(), x.numel(), inverse_float);
  }
  return {FlagOf(found), found};
}

// UnscaleAndCheck, also returning the largest finite magnitude among the tensors as they
// came (the headroom policy's amax) as a float32 [1] tensor.
std::tuple<paddle::Tensor, bool, paddle::Tensor> UnscaleCheckAndMeasure(
    const Tensors& xs, const paddle::Tensor& scale) {
  RequireFloatsOnCpu(xs, "unscale_check_and_measure");
  const double scale_value = ScaleOf(scale);
  const float inverse_float = 1.0f / static_cast<float>(scale_value);
  const double inverse_double = 1.0 / scale_value;
  bool found = false;
  float amax = 0.0f;
  for (const auto& x : xs) {
    auto& tensor = const_cast<paddle::Tensor&>(x);
    float largest = 0.0f;
    found |= IsFloat64(x)
                 ? MeasureDouble(tensor.data<double>(), x.numel(), inverse_double, &largest)
                 : MeasureFloat(tensor.data<float>(), x.numel(), inverse_float, &largest);
    amax = std::max(amax, largest);
  }
  return {FlagOf(found), found, FloatOf(amax)};
}

// UnscaleAndCheck, also returning int64 [len(xs), 2]: (infs, nans) of each tensor before
// it was unscaled, for overflow_report.py, and the amax as UnscaleCheckAndMeasure does.
std::tuple<paddle::Tensor, paddle::Tensor, bool, paddle::Tensor> UnscaleCheckAndTally(
    const Tensors& xs, const paddle::Tensor& scale) {
  RequireFloatsOnCpu(xs, "unscale_check_and_tally");
  const double scale_value = ScaleOf(scale);
  const float inverse_float = 1.0f / static_cast<float>(scale_value);
  const double inverse_double = 1.0 / scale_value;
  const int64_t count = static_cast<int64_t>(xs.size());
  paddle::Tensor tally = paddle::empty({count, 2}, paddle::DataType::INT64, paddle::CPUPlace());
  int64_t* counts = tally.data<int64_t>();
  bool found = false;
  float amax = 0.0f;
  for (int64_t k = 0; k < count; ++k) {
    auto& tensor = const_cast<paddle::Tensor&>(xs[k]);
    int64_t* infs = counts + 2 * k;
    float largest = 0.0f;
    found |= IsFloat64(tensor)
                 ? TallyDouble(tensor.data<double>(), tensor.numel(), inverse_double, infs,
                               infs + 1, &largest)
                 : TallyFloat(tensor.data<float>(), tensor.numel(), inverse_float, infs,
                              infs + 1, &largest);
    amax = std::max(amax, largest);
  }
  return {FlagOf(found), tally, found, FloatOf(amax)};
}

// Zeroes every tensor of `xs` when `found` holds: a plain SGD step then changes nothing.
void ZeroIfFound(const Tensors& xs, const paddle::Tensor& found) {
  RequireFloatsOnCpu(xs, "zero_if_found");
  if (!found.data<bool>()[0]) return;
  for (const auto& x : xs) {
    auto& tensor = const_cast<paddle::Tensor&>(x);
    const size_t width = IsFloat64(x) ? sizeof(double) : sizeof(float);
    std::memset(tensor.data(), 0, width * static_cast<size_t>(x.numel()));
  }
}

// One step of rule.adjust on the host values of the scale and the int32 counters, with
// the arithmetic of Paddle's update_loss_scaling kernel: products in float32, a growth
// that would leave float32's range refused. The bounds apply as the rule says (max_scale
// is +inf for none), and a backoff_divisor above 0 backs off dividing by it (MindSpore's
// functional scaler) rather than multiplying by decr_ratio. Returns whether it fired.
bool AdjustInterval(bool found, float* scale, int32_t* incr, int32_t* decr,
                    int incr_every_n_steps, int decr_every_n_nan_or_inf, float incr_ratio,
                    float decr_ratio, float min_scale, float max_scale, float backoff_divisor) {
  if (found) {
    *incr = 0;
    if (++*decr == decr_every_n_nan_or_inf) {
      const float lowered = backoff_divisor > 0.0f ? *scale / backoff_divisor : *scale * decr_ratio;
      *scale = std::max(lowered, min_scale);
      *decr = 0;
      return true;
    }
    return false;
  }
  *decr = 0;
  if (++*incr == incr_every_n_steps) {
    const float grown = *scale * incr_ratio;
    if (std::isfinite(grown)) *scale = std::min(grown, max_scale);
    *incr = 0;
    return true;
  }
  return false;
}

// rule.adjust in place on the tensors; returns whether it fired, a bool [1] tensor.
paddle::Tensor UpdateScale(const paddle::Tensor& found, paddle::Tensor& scale,
                           paddle::Tensor& incr_count, paddle::Tensor& decr_count,
                           int incr_every_n_steps, int decr_every_n_nan_or_inf, float incr_ratio,
                           float decr_ratio, float min_scale, float max_scale,
                           float backoff_divisor) {
  return FlagOf(AdjustInterval(found.data<bool>()[0], scale.data<float>(),
                               incr_count.data<int32_t>(), decr_count.data<int32_t>(),
                               incr_every_n_steps, decr_every_n_nan_or_inf, incr_ratio,
                               decr_ratio, min_scale, max_scale, backoff_divisor));
}

// rule.adjust_headroom in place, on the scale, the counters and the policy's memory
// (margin, margin_at, grown_at, anchor, last_amax); `growth_factors` (incr_ratio ** k, k = 0..K)
// and `limits` (FLOAT16_MAX / 2 ** margin) are rule.py's float32 tables, so that every
// form compares the same bits. `measured` False: the amax was not measured this
// iteration, and only the interval rule's back-off runs. Returns whether it fired.
paddle::Tensor UpdateScaleHeadroom(
    const paddle::Tensor& found_inf, const paddle::Tensor& amax_tensor, bool measured,
    int64_t iteration, paddle::Tensor& scale, paddle::Tensor& incr_count,
    paddle::Tensor& decr_count, paddle::Tensor& margin, paddle::Tensor& margin_at,
    paddle::Tensor& grown_at, paddle::Tensor& anchor, paddle::Tensor& last_amax,
    int incr_every_n_steps,
    int decr_every_n_nan_or_inf, float decr_ratio, float min_scale, float cap,
    float backoff_divisor, float calibration_stride, int64_t calibration_iterations,
    int min_margin, int max_margin, int32_t never, const paddle::Tensor& growth_factors,
    const paddle::Tensor& limits) {
  const bool found = found_inf.data<bool>()[0];
  float* scale_value = scale.data<float>();
  int32_t* incr = incr_count.data<int32_t>();
  const bool backed_off = AdjustInterval(
      found, scale_value, incr, decr_count.data<int32_t>(), std::numeric_limits<int32_t>::max(),
      decr_every_n_nan_or_inf, 0.0f, decr_ratio, min_scale, cap, backoff_divisor);
  if (!measured) return FlagOf(backed_off);
  float s = *scale_value;
  if (backed_off && iteration <= calibration_iterations) {
    s = std::max(s * calibration_stride, min_scale);
  }
  const float amax = amax_tensor.data<float>()[0];
  int32_t* margin_value = margin.data<int32_t>();
  int32_t* margin_at_value = margin_at.data<int32_t>();
  int32_t* grown_at_value = grown_at.data<int32_t>();
  const bool usable = !found && amax > 0.0f;
  const bool learn = s < anchor.data<float>()[0] &&
                     iteration - *grown_at_value <= incr_every_n_steps / 4;
  const bool quiet =
      usable && !learn && iteration - *margin_at_value >= incr_every_n_steps;
  *margin_value = std::min(std::max(*margin_value + learn - quiet, min_margin), max_margin);
  if (learn || quiet) *margin_at_value = static_cast<int32_t>(iteration);
  // A growth is charged one bit of margin at most: learning forgets it.
  if (learn) *grown_at_value = never;
  bool grew = false;
  if (usable) {
    const float* factors = growth_factors.data<float>();
    const float limit = limits.data<float>()[*margin_value];
    int64_t steps = 0;
    for (int64_t k = 1; k < growth_factors.numel(); ++k) steps += amax * factors[k] <= limit;
    const float grown = std::min(s * factors[steps], cap);
    if (grown > s) {
      s = grown;
      grew = true;
      *grown_at_value = static_cast<int32_t>(iteration);
    }
    last_amax.data<float>()[0] = amax;
  }
  *scale_value = s;
  anchor.data<float>()[0] = s;
  return FlagOf(backed_off || grew);
}

// One iteration's statistics, in place: `counts` is statistics.py's int64 [5]
// [skipped, skip_streak, since_skip, growths, backoffs]; `fired` says whether the update
// rule grew (a finite iteration) or backed off (a skipped one).
void CountIteration(paddle::Tensor& counts, const paddle::Tensor& found,
                    const paddle::Tensor& fired) {
  enum { kSkipped, kStreak, kSinceSkip, kGrowths, kBackoffs };
  int64_t* count = counts.data<int64_t>();
  const bool skipped = found.data<bool>()[0];
  const bool changed = fired.data<bool>()[0];
  if (skipped) {
    count[kSkipped] += 1;
    count[kStreak] += 1;
    count[kSinceSkip] = 0;
    count[kBackoffs] += changed;
  } else {
    count[kStreak] = 0;
    count[kSinceSkip] += 1;
    count[kGrowths] += changed;
  }
}

// The name Python imports, given by fused_cpu.py at build time.
PYBIND11_MODULE(PADDLE_AMP_SCALER_MODULE, module) {
  module.def("unscale_and_check", &UnscaleAndCheck);
  module.def("unscale_check_and_measure", &UnscaleCheckAndMeasure);
  module.def("unscale_check_and_tally", &UnscaleCheckAndTally);
  module.def("zero_if_found", &ZeroIfFound);
  module.def("update_scale", &UpdateScale);
  module.def("update_scale_headroom", &UpdateScaleHeadroom);
  module.def("count_iteration", &CountIteration);
}

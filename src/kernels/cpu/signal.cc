// Signal-processing kernels (ONNX) on the CPU: DFT, STFT, HannWindow,
// HammingWindow, BlackmanWindow, MelWeightMatrix.
//
// The transforms are direct O(n^2) sums per signal (no FFT): correct for any
// length, and the lengths these operators see in models (frames of a few
// hundred samples) keep them cheap. The twiddle factors e^(-2 pi i j / n)
// are tabulated once at prepare in double; sums run in double and round
// once to the output type (f32, f64, f16 or bf16, the input's).
//
// DFT along `axis` of x [..., signal, C] (C = 1 real, 2 complex):
//   forward   X[k] = sum_t x[t] e^(-2 pi i k t / n), k < n (n/2 + 1 when
//             onesided); x is cut or zero-padded to n = dft_length
//   inverse   x[t] = 1/n sum_k X[k] e^(+2 pi i k t / n)
//   inverse and onesided (irfft): X holds bins 0..n/2 of a Hermitian
//             spectrum; the output is the real signal [..., n, 1].
// dft_length must be a constant (it fixes the loops); the axis is an
// attribute, a constant, or (opset 20) a run-time input when the output
// shape does not depend on it. STFT reads frame_step at run time;
// the window functions and MelWeightMatrix read their scalar inputs at run
// time and take their sizes from the output shape.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numbers>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/element_access.h"
#include "kernels/cpu/kernel_checks.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using checks::constantInput;
using checks::expectCounts;
using checks::inputAt;
using checks::present;
using checks::typeText;

using Ints = std::vector<int64_t>;

// A scalar integer input (i32 or i64; a scalar or one-element tensor).
void expectIntegerScalar(std::string_view op, const KernelSetup& setup, size_t index, const char* name) {
  const TensorInfo& info = setup.inputs[index];
  if ((info.dtype != DType::kI32 && info.dtype != DType::kI64) || info.numElements() != 1) {
    throw UsageError(fmt::format("{}: {} must be one i32 or i64 value, got {}", op, name, typeText(info)));
  }
}

int64_t loadInteger(const std::byte* data, DType dtype) {
  return dtype == DType::kI64 ? loadElement<int64_t>(data, 0) : loadElement<int32_t>(data, 0);
}

// The value of constant scalar input `index`; throws when it is not constant.
int64_t constantInteger(std::string_view op, const KernelSetup& setup, size_t index, const char* name) {
  expectIntegerScalar(op, setup, index, name);
  const std::byte* bytes = constantInput(setup, index);
  if (bytes == nullptr) {
    throw UsageError(fmt::format("{}: {} must be a constant (it fixes the loops), but it is computed at run time", op, name));
  }
  return loadInteger(bytes, setup.inputs[index].dtype);
}

void expectFloatType(std::string_view op, const TensorInfo& info, const char* what) {
  if (!isFloatType(info.dtype)) {
    throw UsageError(fmt::format("{}: no kernel for {} {} (supports f32, f64, f16, bf16)", op, what, typeText(info)));
  }
}

// cos and sin of 2 pi j / n for j < n.
struct Twiddles {
  std::vector<double> cos;
  std::vector<double> sin;
};

Twiddles twiddles(int64_t n) {
  Twiddles t;
  for (int64_t j = 0; j < n; ++j) {
    const double angle = 2 * std::numbers::pi * static_cast<double>(j) / static_cast<double>(n);
    t.cos.push_back(std::cos(angle));
    t.sin.push_back(std::sin(angle));
  }
  return t;
}

// ---------------------------------------------------------------------- DFT

// The transform along one axis of x, seen as [outer, in_length, inner, C].
struct DftPlan {
  bool valid = false;  // whether the output shape fits this axis
  int64_t outer = 1;
  int64_t inner = 1;
  int64_t in_length = 0;
  int64_t out_length = 0;
  int64_t n = 0;  // the transform's length
  Twiddles twiddles;
};

struct DftState final : KernelState {
  DType dtype = DType::kF32;
  int64_t in_channels = 1;  // 1 real, 2 complex
  bool inverse = false;
  bool real_output = false;  // irfft: Hermitian input, real output
  // One plan per axis; a constant axis (or the attribute) fills only its
  // own. A run-time axis input (opset 20) picks one per call among those
  // whose output shape is the step's, which is every axis when the transform
  // keeps the axis' length.
  std::vector<DftPlan> plans;
  int64_t axis = -1;  // the fixed axis, or -1: read input 2 per call
  DType axis_type = DType::kI64;
};

// The plan for `axis`; !valid when its output shape is not `y`.
DftPlan planDft(std::string_view op, const KernelSetup& setup, const DftState& s, int64_t axis, bool onesided) {
  const TensorInfo& x = setup.inputs[0];
  const auto rank = static_cast<int64_t>(x.shape.size());
  DftPlan plan;
  for (int64_t d = 0; d < axis; ++d) plan.outer *= x.shape[static_cast<size_t>(d)];
  for (int64_t d = axis + 1; d < rank - 1; ++d) plan.inner *= x.shape[static_cast<size_t>(d)];
  plan.in_length = x.shape[static_cast<size_t>(axis)];
  plan.n = present(setup.inputs, 1) ? constantInteger(op, setup, 1, "dft_length")
                              : (s.real_output ? 2 * (plan.in_length - 1) : plan.in_length);
  if (plan.n < 1) return plan;
  plan.out_length = onesided && !s.inverse ? plan.n / 2 + 1 : plan.n;
  Ints expected = x.shape;
  expected[static_cast<size_t>(axis)] = plan.out_length;
  expected.back() = s.real_output ? 1 : 2;
  plan.valid = setup.outputs[0] == TensorInfo{x.dtype, expected};
  if (plan.valid) plan.twiddles = twiddles(plan.n);
  return plan;
}

std::unique_ptr<KernelState> prepareDft(const KernelSetup& setup) {
  constexpr std::string_view op = "DFT";
  expectCounts(op, setup, 1, 3, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  expectFloatType(op, x, "input");
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (rank < 2 || (x.shape.back() != 1 && x.shape.back() != 2)) {
    throw UsageError(fmt::format("{}: needs an input [..., signal, 1 or 2], got {}", op, typeText(x)));
  }
  auto s = std::make_unique<DftState>();
  s->dtype = x.dtype;
  s->in_channels = x.shape.back();
  s->inverse = setup.params.getInt("inverse", 0) != 0;
  const bool onesided = setup.params.getInt("onesided", 0) != 0;
  s->real_output = s->inverse && onesided;
  s->plans.resize(static_cast<size_t>(rank - 1));
  const bool runtime_axis = present(setup.inputs, 2) && constantInput(setup, 2) == nullptr;
  if (runtime_axis) {
    expectIntegerScalar(op, setup, 2, "axis");
    s->axis_type = setup.inputs[2].dtype;
    bool any = false;
    for (int64_t a = 0; a < rank - 1; ++a) {
      s->plans[static_cast<size_t>(a)] = planDft(op, setup, *s, a, onesided);
      any = any || s->plans[static_cast<size_t>(a)].valid;
    }
    if (!any) {
      throw UsageError(fmt::format("{}: the output {} fits no axis of {}; the axis input must be a constant to tell",
                                   op, typeText(y), typeText(x)));
    }
    return s;
  }
  // Opset 17 takes the axis as an attribute (default 1), opset 20 as input 2
  // (default -2). The kernel does not know the opset: without either, the
  // two defaults must name the same axis (rank 3, [batch, signal, C]).
  int64_t axis = 1;
  if (present(setup.inputs, 2)) {
    axis = constantInteger(op, setup, 2, "axis");
  } else if (setup.params.has("axis")) {
    axis = setup.params.getInt("axis", 1);
  } else if (rank != 3) {
    throw UsageError(fmt::format("{}: no axis given, and for {} the default differs between opset 17 (1) and 20 "
                                 "(-2); give the axis explicitly",
                                 op, typeText(x)));
  }
  if (axis < -rank || axis >= rank - 1 || axis == -1) {
    throw UsageError(fmt::format("{}: axis {} is not a signal axis of {}", op, axis, typeText(x)));
  }
  if (axis < 0) axis += rank;
  s->axis = axis;
  DftPlan& plan = s->plans[static_cast<size_t>(axis)];
  plan = planDft(op, setup, *s, axis, onesided);
  if (plan.n < 1) throw UsageError(fmt::format("{}: the transform length {} is not positive", op, plan.n));
  if (!plan.valid) {
    Ints expected = x.shape;
    expected[static_cast<size_t>(axis)] = plan.out_length;
    expected.back() = s->real_output ? 1 : 2;
    throw UsageError(fmt::format("{}: the output {} must be {}", op, typeText(y), typeText({x.dtype, expected})));
  }
  return s;
}

// One signal: input element t at x + t * x_stride (channels after it),
// output bin k at y + k * y_stride.
void dftSignal(const DftState& s, const DftPlan& plan, const std::byte* x, int64_t x_offset, int64_t x_stride,
               std::byte* y, int64_t y_offset, int64_t y_stride) {
  const int64_t n = plan.n;
  const double sign = s.inverse ? 1.0 : -1.0;
  const double norm = s.inverse ? 1.0 / static_cast<double>(n) : 1.0;
  const std::vector<double>& cos = plan.twiddles.cos;
  const std::vector<double>& sin = plan.twiddles.sin;
  auto re = [&](int64_t t) { return loadAsDouble(x, s.dtype, x_offset + t * x_stride); };
  auto im = [&](int64_t t) {
    return s.in_channels == 2 ? loadAsDouble(x, s.dtype, x_offset + t * x_stride + 1) : 0.0;
  };
  if (s.real_output) {
    // Bins 0..n/2 (zero beyond the input); the rest mirror them conjugated.
    const int64_t half = n / 2;
    for (int64_t t = 0; t < plan.out_length; ++t) {
      double sum = 0;
      for (int64_t k = 0; k < n; ++k) {
        const bool mirrored = k > half;
        const int64_t bin = mirrored ? n - k : k;
        if (bin >= plan.in_length) continue;
        const double xr = re(bin);
        const double xi = mirrored ? -im(bin) : im(bin);
        const auto j = static_cast<size_t>((k * t) % n);
        sum += xr * cos[j] - xi * sin[j];
      }
      storeFloat(y, s.dtype, y_offset + t * y_stride, sum * norm);
    }
    return;
  }
  const int64_t used = std::min(plan.in_length, n);
  for (int64_t k = 0; k < plan.out_length; ++k) {
    double sum_re = 0;
    double sum_im = 0;
    for (int64_t t = 0; t < used; ++t) {
      const auto j = static_cast<size_t>((k * t) % n);
      const double c = cos[j];
      const double sn = sign * sin[j];
      const double xr = re(t);
      const double xi = im(t);
      sum_re += xr * c - xi * sn;
      sum_im += xr * sn + xi * c;
    }
    storeFloat(y, s.dtype, y_offset + k * y_stride, sum_re * norm);
    storeFloat(y, s.dtype, y_offset + k * y_stride + 1, sum_im * norm);
  }
}

void runDft(const KernelCall& call) {
  const auto& s = static_cast<const DftState&>(*call.state);
  int64_t axis = s.axis;
  if (axis < 0) {
    const auto axes = static_cast<int64_t>(s.plans.size());  // rank - 1
    axis = loadInteger(call.inputs[2].data, s.axis_type);
    if (axis < 0) axis += axes + 1;
  }
  const TensorView& out = call.outputs[0];
  if (axis < 0 || axis >= static_cast<int64_t>(s.plans.size()) || !s.plans[static_cast<size_t>(axis)].valid) {
    // An axis this step's shapes do not fit (run must not throw): NaN.
    for (uint64_t i = 0; i < out.numElements(); ++i) {
      storeFloat(out.data, s.dtype, static_cast<int64_t>(i), std::numeric_limits<double>::quiet_NaN());
    }
    return;
  }
  const DftPlan& plan = s.plans[static_cast<size_t>(axis)];
  const int64_t out_channels = s.real_output ? 1 : 2;
  for (int64_t o = 0; o < plan.outer; ++o) {
    for (int64_t r = 0; r < plan.inner; ++r) {
      dftSignal(s, plan, call.inputs[0].data, (o * plan.in_length * plan.inner + r) * s.in_channels,
                plan.inner * s.in_channels, out.data, (o * plan.out_length * plan.inner + r) * out_channels,
                plan.inner * out_channels);
    }
  }
}

// --------------------------------------------------------------------- STFT

struct StftState final : KernelState {
  DType dtype = DType::kF32;
  int64_t batch = 0;
  int64_t length = 0;  // signal samples
  int64_t channels = 1;
  int64_t frames = 0;
  int64_t bins = 0;
  int64_t n = 0;  // frame_length
  bool has_window = false;
  Twiddles twiddles;
};

std::unique_ptr<KernelState> prepareStft(const KernelSetup& setup) {
  constexpr std::string_view op = "STFT";
  expectCounts(op, setup, 2, 4, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  expectFloatType(op, x, "signal");
  if (x.shape.size() != 3 || x.shape[2] < 1 || x.shape[2] > 2) {
    throw UsageError(fmt::format("{}: needs a signal [batch, length, 1 or 2], got {}", op, typeText(x)));
  }
  expectIntegerScalar(op, setup, 1, "frame_step");
  auto s = std::make_unique<StftState>();
  s->dtype = x.dtype;
  s->batch = x.shape[0];
  s->length = x.shape[1];
  s->channels = x.shape[2];
  s->has_window = present(setup.inputs, 2);
  if (s->has_window) {
    const TensorInfo& window = setup.inputs[2];
    if (window.dtype != x.dtype || window.shape.size() != 1) {
      throw UsageError(fmt::format("{}: the window {} must be 1-D of the signal's type", op, typeText(window)));
    }
    s->n = window.shape[0];
  }
  if (present(setup.inputs, 3)) {
    const int64_t frame_length = constantInteger(op, setup, 3, "frame_length");
    if (s->has_window && frame_length != s->n) {
      throw UsageError(fmt::format("{}: frame_length {} differs from the window's {} values", op, frame_length, s->n));
    }
    s->n = frame_length;
  } else if (!s->has_window) {
    s->n = s->length;
  }
  if (s->n < 1 || s->n > s->length) {
    throw UsageError(fmt::format("{}: frame_length {} must be in [1, {}] (the signal's length)", op, s->n, s->length));
  }
  const TensorInfo& y = setup.outputs[0];
  const bool onesided = setup.params.getInt("onesided", 1) != 0;
  s->bins = onesided ? s->n / 2 + 1 : s->n;
  if (y.dtype != x.dtype || y.shape.size() != 4 || y.shape[0] != s->batch || y.shape[2] != s->bins || y.shape[3] != 2) {
    throw UsageError(fmt::format("{}: the output {} must be [{}, frames, {}, 2] of the signal's type", op,
                                 typeText(y), s->batch, s->bins));
  }
  s->frames = y.shape[1];
  s->twiddles = twiddles(s->n);
  return s;
}

void runStft(const KernelCall& call) {
  const auto& s = static_cast<const StftState&>(*call.state);
  const std::byte* x = call.inputs[0].data;
  const std::byte* window = s.has_window ? call.inputs[2].data : nullptr;
  std::byte* y = call.outputs[0].data;
  const int64_t step = std::max<int64_t>(1, loadInteger(call.inputs[1].data, call.inputs[1].dtype));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t f = 0; f < s.frames; ++f) {
      const int64_t start = f * step;
      for (int64_t k = 0; k < s.bins; ++k) {
        double sum_re = 0;
        double sum_im = 0;
        // Samples past the signal's end (a frame_step larger than the
        // output's frame count implies) read as zero.
        const int64_t used = std::min(s.n, s.length - start);
        for (int64_t t = 0; t < used; ++t) {
          const int64_t at = (b * s.length + start + t) * s.channels;
          const double w = window ? loadAsDouble(window, s.dtype, t) : 1.0;
          const double xr = w * loadAsDouble(x, s.dtype, at);
          const double xi = s.channels == 2 ? w * loadAsDouble(x, s.dtype, at + 1) : 0.0;
          const auto j = static_cast<size_t>((k * t) % s.n);
          const double c = s.twiddles.cos[j];
          const double sn = -s.twiddles.sin[j];
          sum_re += xr * c - xi * sn;
          sum_im += xr * sn + xi * c;
        }
        const int64_t out = ((b * s.frames + f) * s.bins + k) * 2;
        storeFloat(y, s.dtype, out, sum_re);
        storeFloat(y, s.dtype, out + 1, sum_im);
      }
    }
  }
}

// --------------------------------------------------------- window functions

enum class WindowKind { kHann, kHamming, kBlackman };

struct WindowState final : KernelState {
  WindowKind kind = WindowKind::kHann;
  DType dtype = DType::kF32;
  int64_t size = 0;
  bool periodic = true;
};

template <WindowKind kKind>
std::unique_ptr<KernelState> prepareWindow(const KernelSetup& setup) {
  constexpr std::string_view names[] = {"HannWindow", "HammingWindow", "BlackmanWindow"};
  const std::string_view op = names[static_cast<int>(kKind)];
  expectCounts(op, setup, 1, 1, 1, 1);
  expectIntegerScalar(op, setup, 0, "size");
  const TensorInfo& y = setup.outputs[0];
  expectFloatType(op, y, "output");
  if (y.shape.size() != 1) throw UsageError(fmt::format("{}: the output {} must be 1-D", op, typeText(y)));
  auto s = std::make_unique<WindowState>();
  s->kind = kKind;
  s->dtype = y.dtype;
  s->size = y.shape[0];
  s->periodic = setup.params.getInt("periodic", 1) != 0;
  return s;
}

// The ONNX definitions with N = size (periodic) or size - 1 (symmetric):
//   Hann      0.5 - 0.5 cos(2 pi n / N)
//   Hamming   25/46 - 21/46 cos(2 pi n / N)
//   Blackman  0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)
void runWindow(const KernelCall& call) {
  const auto& s = static_cast<const WindowState&>(*call.state);
  const double span = static_cast<double>(s.periodic ? s.size : s.size - 1);
  for (int64_t i = 0; i < s.size; ++i) {
    // A one-element symmetric window divides 0 by 0; torch and onnx give 1.
    const double phase = span > 0 ? 2 * std::numbers::pi * static_cast<double>(i) / span : 0.0;
    double v = 0;
    switch (s.kind) {
      case WindowKind::kHann: v = 0.5 - 0.5 * std::cos(phase); break;
      case WindowKind::kHamming: v = 25.0 / 46.0 - (21.0 / 46.0) * std::cos(phase); break;
      case WindowKind::kBlackman: v = 0.42 - 0.5 * std::cos(phase) + 0.08 * std::cos(2 * phase); break;
    }
    storeFloat(call.outputs[0].data, s.dtype, i, span > 0 ? v : 1.0);
  }
}

// ----------------------------------------------------------- MelWeightMatrix

struct MelState final : KernelState {
  DType dtype = DType::kF32;
  int64_t spectrogram_bins = 0;
  int64_t mel_bins = 0;
};

std::unique_ptr<KernelState> prepareMel(const KernelSetup& setup) {
  constexpr std::string_view op = "MelWeightMatrix";
  expectCounts(op, setup, 5, 5, 1, 1);
  expectIntegerScalar(op, setup, 0, "num_mel_bins");
  expectIntegerScalar(op, setup, 1, "dft_length");
  expectIntegerScalar(op, setup, 2, "sample_rate");
  for (size_t i : {3u, 4u}) {
    expectFloatType(op, setup.inputs[i], "edge frequency");
    if (setup.inputs[i].numElements() != 1) {
      throw UsageError(fmt::format("{}: input {} {} must hold one value", op, i, typeText(setup.inputs[i])));
    }
  }
  const TensorInfo& y = setup.outputs[0];
  expectFloatType(op, y, "output");
  if (y.shape.size() != 2) throw UsageError(fmt::format("{}: the output {} must be 2-D", op, typeText(y)));
  auto s = std::make_unique<MelState>();
  s->dtype = y.dtype;
  s->spectrogram_bins = y.shape[0];
  s->mel_bins = y.shape[1];
  return s;
}

double hertzToMel(double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); }
double melToHertz(double mel) { return 700.0 * (std::pow(10.0, mel / 2595.0) - 1.0); }

// Triangular filters between num_mel_bins + 2 points evenly spaced in mel
// from lower to upper edge, each point at spectrogram bin
// floor((dft_length + 1) * hz / sample_rate), as onnx's reference does.
void runMel(const KernelCall& call) {
  const auto& s = static_cast<const MelState&>(*call.state);
  const TensorView* in = call.inputs;
  const int64_t dft_length = loadInteger(in[1].data, in[1].dtype);
  const int64_t sample_rate = std::max<int64_t>(1, loadInteger(in[2].data, in[2].dtype));
  const double low = hertzToMel(loadAsDouble(in[3].data, in[3].dtype, 0));
  const double high = hertzToMel(loadAsDouble(in[4].data, in[4].dtype, 0));
  const int64_t points = s.mel_bins + 2;
  const double step = (high - low) / static_cast<double>(points);
  std::byte* y = call.outputs[0].data;
  for (int64_t i = 0; i < s.spectrogram_bins * s.mel_bins; ++i) storeFloat(y, s.dtype, i, 0.0);
  auto bin = [&](int64_t point) {
    const double hz = melToHertz(static_cast<double>(point) * step + low);
    return static_cast<int64_t>(std::floor(static_cast<double>(dft_length + 1) * hz / static_cast<double>(sample_rate)));
  };
  auto set = [&](int64_t row, int64_t column, double v) {
    if (row >= 0 && row < s.spectrogram_bins) storeFloat(y, s.dtype, row * s.mel_bins + column, v);
  };
  for (int64_t i = 0; i < s.mel_bins; ++i) {
    const int64_t left = bin(i);
    const int64_t center = bin(i + 1);
    const int64_t right = bin(i + 2);
    if (center == left) {
      set(center, i, 1.0);
    } else {
      for (int64_t j = left; j <= center; ++j) set(j, i, static_cast<double>(j - left) / static_cast<double>(center - left));
    }
    for (int64_t j = center; j < right; ++j) set(j, i, static_cast<double>(right - j) / static_cast<double>(right - center));
  }
}

}  // namespace

void registerSignalKernels(KernelRegistry& registry) {
  registry.add({"DFT", prepareDft, runDft});
  registry.add({"STFT", prepareStft, runStft});
  registry.add({"HannWindow", prepareWindow<WindowKind::kHann>, runWindow});
  registry.add({"HammingWindow", prepareWindow<WindowKind::kHamming>, runWindow});
  registry.add({"BlackmanWindow", prepareWindow<WindowKind::kBlackman>, runWindow});
  registry.add({"MelWeightMatrix", prepareMel, runMel});
}

}  // namespace kiln

#include "kernels/cpu/integer_conv_gemm.h"

#include <dnnl.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/exact_int_gemm.h"
#include "kernels/cpu/parallel.h"

namespace kiln {
namespace {

// The k block whose partial sums stay exact in f32 (see the header).
constexpr int64_t kExactBlock = 256;
// About 1 MiB of columns per GEMM call.
constexpr int64_t kColumnFloats = int64_t{1} << 18;

float integerAt(DType dtype, const std::byte* data, int64_t i) {
  return dtype == DType::kU8 ? static_cast<float>(reinterpret_cast<const uint8_t*>(data)[i])
                             : static_cast<float>(reinterpret_cast<const int8_t*>(data)[i]);
}

// The positions j of [0, run) whose input column (ow + j) * stride + first
// lies inside [0, width): [lo, hi), empty when lo == hi.
struct ColumnRange {
  int64_t lo = 0, hi = 0;
};
ColumnRange insideColumns(int64_t ow, int64_t run, int64_t stride, int64_t first, int64_t width) {
  // (ow + j) * stride + first >= 0  <=>  j >= ceil(-first / stride) - ow
  const int64_t need = -first;
  const int64_t min_column = need <= 0 ? 0 : (need + stride - 1) / stride;
  // (ow + j) * stride + first <= width - 1  <=>  j <= floor((width - 1 - first) / stride) - ow
  const int64_t room = width - 1 - first;
  const int64_t max_column = room < 0 ? -1 : room / stride;
  const int64_t lo = std::clamp(min_column - ow, int64_t{0}, run);
  return {lo, std::clamp(max_column - ow + 1, lo, run)};
}

// columns[r, i] = convert(x at kernel offset k0 + r for output position
// p0 + i), or `padding` where the kernel reads padding; x_group points at
// the group's first input channel. The rows are split across the threads:
// unfolding is most of a narrow layer's time (24 output channels over 4096
// positions: the GEMM is a few microseconds, the unfolding was 0.7 ms on
// one thread with a bounds check per element).
template <typename TX, typename TOut, typename Convert>
void unfold(const ConvGeometry& g, const TX* x_group, int64_t k0, int64_t rows, int64_t p0, int64_t count,
            TOut padding, const Convert& convert, TOut* columns) {
  const int64_t kernel_size = g.kernelSize();
  const int64_t stride = g.strides[2];
  parallelForItems(rows, count, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t kk = k0 + r;
      const int64_t at = kk % kernel_size;
      const int64_t kd = at / (g.kernel[1] * g.kernel[2]);
      const int64_t kh = (at / g.kernel[2]) % g.kernel[1];
      const int64_t kw = at % g.kernel[2];
      const TX* x_c = x_group + (kk / kernel_size) * g.inPlane();
      TOut* dst = columns + r * count;
      const int64_t first = kw * g.dilations[2] - g.pad_begin[2];
      // One output row (fixed od, oh) at a time: its input row is fixed too.
      for (int64_t i = 0, p = p0; i < count;) {
        const int64_t ow = p % g.out[2];
        const int64_t oh = (p / g.out[2]) % g.out[1];
        const int64_t od = p / (g.out[2] * g.out[1]);
        const int64_t run = std::min(g.out[2] - ow, count - i);
        const int64_t id = od * g.strides[0] - g.pad_begin[0] + kd * g.dilations[0];
        const int64_t ih = oh * g.strides[1] - g.pad_begin[1] + kh * g.dilations[1];
        TOut* out = dst + i;
        if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
          std::fill(out, out + run, padding);
        } else {
          // (Locals by value: stores through an 8-bit `out` may alias
          // anything the compiler cannot see is local, which keeps the
          // loops below scalar.)
          const auto [lo, hi] = insideColumns(ow, run, stride, first, g.in[2]);
          std::fill(out, out + lo, padding);
          const TX* from = x_c + (id * g.in[1] + ih) * g.in[2] + ow * stride + first;
          if (stride == 1) {
            // Blocks of 16 through local arrays become a few vector
            // instructions each (the compiler cannot prove that `out` and
            // `from` do not overlap, and runs of 32-128 positions are too
            // short for its own vector loop anyway).
            int64_t j = lo;
            for (; j + 16 <= hi; j += 16) {
              TX in[16];
              TOut converted[16];
              std::memcpy(in, from + j, sizeof(in));
              for (int64_t t = 0; t < 16; ++t) converted[t] = convert(in[t]);
              std::memcpy(out + j, converted, sizeof(converted));
            }
            for (; j < hi; ++j) out[j] = convert(from[j]);
          } else {
            for (int64_t j = lo; j < hi; ++j) out[j] = convert(from[j * stride]);
          }
          std::fill(out + hi, out + run, padding);
        }
        i += run;
        p += run;
      }
    }
  });
}

template <typename TX>
void convolveS8(const IntegerConvGemm& conv, const TX* x, int32_t x_zero, int32_t* y) {
  const ConvGeometry& g = conv.geometry;
  constexpr int shift = std::is_same_v<TX, uint8_t> ? 128 : 0;
  const auto x_zero_s8 = static_cast<int8_t>(x_zero - shift);
  const int64_t group_in = g.in_channels / g.group;
  const int64_t group_out = g.out_channels / g.group;
  const int64_t positions = g.outPlane();
  const int32_t no_offset = 0;
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t group = 0; group < g.group; ++group) {
      const TX* x_group = x + (n * g.in_channels + group * group_in) * g.inPlane();
      const int8_t* w_group = conv.weights_s8.data() + group * group_out * conv.depth;
      int32_t* y_group = y + (n * g.out_channels + group * group_out) * positions;
      for (int64_t p0 = 0; p0 < positions; p0 += conv.chunk) {
        const int64_t count = std::min(conv.chunk, positions - p0);
        unfold(g, x_group, 0, conv.depth, p0, count, x_zero_s8,
               [](TX v) { return static_cast<int8_t>(static_cast<int>(v) - shift); }, conv.columns_s8.data());
        dnnl_gemm_s8s8s32('N', 'N', 'F', group_out, count, conv.depth, 1.0f, w_group, conv.depth, conv.w_zero_s8,
                          conv.columns_s8.data(), count, x_zero_s8, 0.0f, y_group + p0, positions, &no_offset);
      }
    }
  }
}

template <typename TX>
void convolve(const IntegerConvGemm& conv, const TX* x, float zero, int32_t* y) {
  const ConvGeometry& g = conv.geometry;
  const int64_t group_in = g.in_channels / g.group;
  const int64_t group_out = g.out_channels / g.group;
  const int64_t positions = g.outPlane();
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t group = 0; group < g.group; ++group) {
      const TX* x_group = x + (n * g.in_channels + group * group_in) * g.inPlane();
      const float* w_group = conv.weights.data() + group * group_out * conv.depth;
      int32_t* y_group = y + (n * g.out_channels + group * group_out) * positions;
      for (int64_t p0 = 0; p0 < positions; p0 += conv.chunk) {
        const int64_t count = std::min(conv.chunk, positions - p0);
        for (int64_t k0 = 0; k0 < conv.depth; k0 += kExactBlock) {
          const int64_t rows = std::min(kExactBlock, conv.depth - k0);
          unfold(g, x_group, k0, rows, p0, count, 0.0f, [zero](TX v) { return static_cast<float>(v) - zero; },
                 conv.columns.data());
          dnnl_sgemm('N', 'N', group_out, count, rows, 1.0f, w_group + k0, conv.depth, conv.columns.data(), count,
                     0.0f, conv.sums.data(), count);
          for (int64_t m = 0; m < group_out; ++m) {
            int32_t* out = y_group + m * positions + p0;
            const float* sums = conv.sums.data() + m * count;
            if (k0 == 0) {
              for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(sums[i]);
            } else {
              for (int64_t i = 0; i < count; ++i) out[i] += static_cast<int32_t>(sums[i]);
            }
          }
        }
      }
    }
  }
}

}  // namespace

std::unique_ptr<IntegerConvGemm> prepareIntegerConvGemm(const ConvGeometry& geometry, DType w_dtype,
                                                        const std::byte* w, const std::byte* w_zero,
                                                        int64_t w_zero_stride) {
  auto conv = std::make_unique<IntegerConvGemm>();
  const ConvGeometry& g = geometry;
  conv->geometry = g;
  conv->depth = g.in_channels / g.group * g.kernelSize();
  if (w_zero_stride == 0 && cpuHasVnni()) {
    const int shift = w_dtype == DType::kU8 ? 128 : 0;
    conv->vnni = true;
    conv->weights_s8.resize(static_cast<size_t>(g.out_channels * conv->depth));
    for (size_t i = 0; i < conv->weights_s8.size(); ++i) {
      conv->weights_s8[i] = static_cast<int8_t>(integerAt(w_dtype, w, static_cast<int64_t>(i)) - static_cast<float>(shift));
    }
    conv->w_zero_s8 = static_cast<int8_t>((w_zero == nullptr ? 0.0f : integerAt(w_dtype, w_zero, 0)) - static_cast<float>(shift));
    conv->chunk = std::min(g.outPlane(), std::max<int64_t>(256, (int64_t{1} << 20) / conv->depth));
    conv->columns_s8.resize(static_cast<size_t>(conv->depth * conv->chunk));
    return conv;
  }
  const int64_t block_rows = std::min(conv->depth, kExactBlock);
  conv->chunk = std::min(g.outPlane(), std::max<int64_t>(256, kColumnFloats / block_rows));
  conv->weights.resize(static_cast<size_t>(g.out_channels * conv->depth));
  for (int64_t m = 0; m < g.out_channels; ++m) {
    const float zero = w_zero == nullptr ? 0.0f : integerAt(w_dtype, w_zero, w_zero_stride == 0 ? 0 : m);
    for (int64_t k = 0; k < conv->depth; ++k) {
      conv->weights[static_cast<size_t>(m * conv->depth + k)] = integerAt(w_dtype, w, m * conv->depth + k) - zero;
    }
  }
  conv->columns.resize(static_cast<size_t>(block_rows * conv->chunk));
  conv->sums.resize(static_cast<size_t>(g.out_channels / g.group * conv->chunk));
  return conv;
}

bool runIntegerConvGemm(const IntegerConvGemm& conv, DType x_dtype, const std::byte* x, int32_t x_zero, int32_t* y) {
  if (conv.busy.exchange(true, std::memory_order_acquire)) return false;
  const auto zero = static_cast<float>(x_zero);
  if (conv.vnni && x_dtype == DType::kU8) {
    convolveS8(conv, reinterpret_cast<const uint8_t*>(x), x_zero, y);
  } else if (conv.vnni) {
    convolveS8(conv, reinterpret_cast<const int8_t*>(x), x_zero, y);
  } else if (x_dtype == DType::kU8) {
    convolve(conv, reinterpret_cast<const uint8_t*>(x), zero, y);
  } else {
    convolve(conv, reinterpret_cast<const int8_t*>(x), zero, y);
  }
  conv.busy.store(false, std::memory_order_release);
  return true;
}

}  // namespace kiln

// GCC 12 reports its own AVX-512 intrinsics (the _mm512_undefined_* idiom
// inside them) as "may be used uninitialized": a false positive, silenced for
// this file before any header brings <immintrin.h> in.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "kernels/cpu/dynamic_int8_matmul.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_checks.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_kernels.h"
#include "kiln/error.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

// Functions with this attribute use AVX-512 VNNI intrinsics; they run only
// where dynamicInt8UsesVnni() said yes. (kiln itself builds for baseline
// x86-64, and lambdas would not inherit the attribute: none are used there.)
#define KILN_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

namespace kiln {
namespace {

constexpr int64_t kGroup = kDynamicInt8Group;
constexpr int64_t kBlock = 32;     // columns per packed block: two zmm registers of i32 sums
constexpr int64_t kSteps = kGroup / 4;  // vpdpbusd steps per group (4 bytes of k each)
constexpr int64_t kPanelRows = 6;  // rows per register tile: 12 sums + 12 f32 totals + 2 weights
constexpr int64_t kMaxGroups = kDynamicInt8MaxDepth / kGroup;

// ------------------------------------------------------------ quantization

// The scale, its reciprocal and the zero point of a group whose values
// (with 0) lie in [lo, hi]; see the header.
struct GroupScale {
  float scale = 1.0f;
  float inverse = 1.0f;
  float zero = 0.0f;
};

inline GroupScale groupScale(float lo, float hi) {
  float scale = (hi - lo) / 255.0f;
  if (!(scale >= std::numeric_limits<float>::min() && scale <= std::numeric_limits<float>::max())) scale = 1.0f;
  const float inverse = 1.0f / scale;
  float zero = std::nearbyint(-lo * inverse);
  if (!(zero >= 0.0f)) zero = 0.0f;
  if (zero > 255.0f) zero = 255.0f;
  return {scale, inverse, zero};
}

// A row's groups into q (u8, groups * kGroup of them, zeros past k), their
// scales s and shifts s * z. The portable form; quantizeRowVnni is the same.
void quantizeRowPortable(const float* x, int64_t k, int64_t groups, uint8_t* q, float* scales, float* shifts) {
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * kGroup;
    const int64_t end = std::min(k, begin + kGroup);
    float lo = 0.0f;
    float hi = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      lo = std::min(lo, x[i]);  // a NaN is skipped, as by the vector path
      hi = std::max(hi, x[i]);
    }
    const GroupScale gs = groupScale(lo, hi);
    for (int64_t i = begin; i < begin + kGroup; ++i) {
      float v = i < end ? std::nearbyint(x[i] * gs.inverse) + gs.zero : 0.0f;
      if (!(v >= 0.0f)) v = 0.0f;
      if (v > 255.0f) v = 255.0f;
      q[i] = static_cast<uint8_t>(v);
    }
    scales[g] = gs.scale;
    shifts[g] = gs.scale * gs.zero;
  }
}

KILN_VNNI_TARGET inline __m512i quantize16(__m512 v, __m512 inverse, __m512 zero, __m512 top) {
  __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, inverse), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  r = _mm512_add_ps(r, zero);
  r = _mm512_max_ps(r, _mm512_setzero_ps());  // NaN -> 0 (max_ps returns its second operand then)
  r = _mm512_min_ps(r, top);
  return _mm512_cvtps_epi32(r);
}

KILN_VNNI_TARGET void quantizeRowVnni(const float* x, int64_t k, int64_t groups, uint8_t* q, float* scales,
                                      float* shifts) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512 top = _mm512_set1_ps(255.0f);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * kGroup;
    const int64_t count = std::min(kGroup, k - begin);
    const auto low_mask = static_cast<__mmask16>(count >= 16 ? 0xFFFFu : (1u << count) - 1u);
    const auto high_mask = static_cast<__mmask16>(count >= 32 ? 0xFFFFu : count > 16 ? (1u << (count - 16)) - 1u : 0u);
    const __m512 v0 = _mm512_maskz_loadu_ps(low_mask, x + begin);
    const __m512 v1 = _mm512_maskz_loadu_ps(high_mask, x + begin + 16);
    // min_ps/max_ps return their second operand when one is NaN: NaNs drop out.
    const float lo = _mm512_reduce_min_ps(_mm512_min_ps(v0, _mm512_min_ps(v1, zero)));
    const float hi = _mm512_reduce_max_ps(_mm512_max_ps(v0, _mm512_max_ps(v1, zero)));
    const GroupScale gs = groupScale(lo, hi);
    const __m512 inverse = _mm512_set1_ps(gs.inverse);
    const __m512 zero_point = _mm512_set1_ps(gs.zero);
    const __m512i q0 = _mm512_maskz_mov_epi32(low_mask, quantize16(v0, inverse, zero_point, top));
    const __m512i q1 = _mm512_maskz_mov_epi32(high_mask, quantize16(v1, inverse, zero_point, top));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + begin), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + begin + 16), _mm512_cvtepi32_epi8(q1));
    scales[g] = gs.scale;
    shifts[g] = gs.scale * gs.zero;
  }
}

// ------------------------------------------------------------ products

// One panel of rows, quantized: q [rows][groups * kGroup], scales and shifts
// [rows][groups].
struct Panel {
  const uint8_t* q;
  const float* scales;
  const float* shifts;
  int64_t depth;  // groups * kGroup: q's row stride
  int64_t groups;
};

// Rows [0, R) of the panel times column block `block` into y (row stride n),
// the block's first `columns` columns. Sums in registers, see the header:
// the loops over rows and steps are unrolled so that the arrays below are
// registers (without it GCC keeps them on the stack, at a third of the speed).
template <int R>
KILN_VNNI_TARGET void tileVnni(const DynamicInt8MatMul& mm, const Panel& panel, int64_t block, float* y) {
  const int8_t* weights = mm.packed.data() + block * panel.depth * kBlock;
  const float* sums = mm.column_sums.data() + block * panel.groups * kBlock;
  __m512 total[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm512_setzero_ps();
  for (int64_t g = 0; g < panel.groups; ++g) {
    __m512i acc[R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    const int8_t* b = weights + g * kGroup * kBlock;
    const uint8_t* a = panel.q + g * kGroup;
#pragma GCC unroll 8
    for (int64_t s = 0; s < kSteps; ++s) {
      const __m512i b0 = _mm512_loadu_si512(b + s * 4 * kBlock);
      const __m512i b1 = _mm512_loadu_si512(b + s * 4 * kBlock + 64);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, a + r * panel.depth + s * 4, sizeof four);
        const __m512i av = _mm512_set1_epi32(four);
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], av, b0);
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], av, b1);
      }
    }
    const __m512 c0 = _mm512_loadu_ps(sums + g * kBlock);
    const __m512 c1 = _mm512_loadu_ps(sums + g * kBlock + 16);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 scale = _mm512_set1_ps(panel.scales[r * panel.groups + g]);
      const __m512 shift = _mm512_set1_ps(panel.shifts[r * panel.groups + g]);
      total[r][0] = _mm512_fnmadd_ps(c0, shift, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][0]), scale, total[r][0]));
      total[r][1] = _mm512_fnmadd_ps(c1, shift, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][1]), scale, total[r][1]));
    }
  }
  const int64_t column0 = block * kBlock;
  const int64_t columns = std::min(kBlock, mm.n - column0);
  const auto mask0 = static_cast<__mmask16>(columns >= 16 ? 0xFFFFu : (1u << columns) - 1u);
  const auto mask1 =
      static_cast<__mmask16>(columns >= 32 ? 0xFFFFu : columns > 16 ? (1u << (columns - 16)) - 1u : 0u);
  const __m512 w0 = _mm512_loadu_ps(mm.w_scale.data() + column0);
  const __m512 w1 = _mm512_loadu_ps(mm.w_scale.data() + column0 + 16);
  const __m512 bias0 = _mm512_loadu_ps(mm.bias.data() + column0);
  const __m512 bias1 = _mm512_loadu_ps(mm.bias.data() + column0 + 16);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* row = y + r * mm.n + column0;
    _mm512_mask_storeu_ps(row, mask0, _mm512_fmadd_ps(total[r][0], w0, bias0));
    _mm512_mask_storeu_ps(row + 16, mask1, _mm512_fmadd_ps(total[r][1], w1, bias1));
  }
}

KILN_VNNI_TARGET void panelVnni(const DynamicInt8MatMul& mm, const Panel& panel, int64_t rows, int64_t block,
                                float* y) {
  switch (rows) {
    case 1: tileVnni<1>(mm, panel, block, y); break;
    case 2: tileVnni<2>(mm, panel, block, y); break;
    case 3: tileVnni<3>(mm, panel, block, y); break;
    case 4: tileVnni<4>(mm, panel, block, y); break;
    case 5: tileVnni<5>(mm, panel, block, y); break;
    default: tileVnni<6>(mm, panel, block, y); break;
  }
}

// The same sums and roundings as tileVnni, one row and column at a time.
void panelPortable(const DynamicInt8MatMul& mm, const Panel& panel, int64_t rows, int64_t block, float* y) {
  const int64_t column0 = block * kBlock;
  const int64_t columns = std::min(kBlock, mm.n - column0);
  for (int64_t r = 0; r < rows; ++r) {
    float total[kBlock] = {};
    for (int64_t g = 0; g < panel.groups; ++g) {
      int32_t acc[kBlock] = {};
      for (int64_t i = g * kGroup; i < std::min(mm.k, (g + 1) * kGroup); ++i) {
        const int32_t a = panel.q[r * panel.depth + i];
        const int8_t* w = mm.plain.data() + i * mm.n + column0;
        for (int64_t c = 0; c < columns; ++c) acc[c] += a * w[c];
      }
      const float scale = panel.scales[r * panel.groups + g];
      const float shift = panel.shifts[r * panel.groups + g];
      const float* sums = mm.column_sums.data() + (block * panel.groups + g) * kBlock;
      for (int64_t c = 0; c < columns; ++c) {
        total[c] = std::fma(-sums[c], shift, std::fma(static_cast<float>(acc[c]), scale, total[c]));
      }
    }
    for (int64_t c = 0; c < columns; ++c) {
      y[r * mm.n + column0 + c] = std::fma(total[c], mm.w_scale[column0 + c], mm.bias[column0 + c]);
    }
  }
}

// Rows [row0, row0 + rows) (rows <= kPanelRows) times column blocks
// [block_begin, block_end). The quantized panel lives on this call's stack.
void runPanel(const DynamicInt8MatMul& mm, const float* x, float* y, int64_t row0, int64_t rows, int64_t block_begin,
              int64_t block_end) {
  alignas(64) uint8_t q[kPanelRows * kDynamicInt8MaxDepth];
  float scales[kPanelRows * kMaxGroups];
  float shifts[kPanelRows * kMaxGroups];
  const Panel panel{q, scales, shifts, mm.groups * kGroup, mm.groups};
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + (row0 + r) * mm.k;
    uint8_t* qr = q + r * panel.depth;
    if (mm.vnni) {
      quantizeRowVnni(row, mm.k, mm.groups, qr, scales + r * mm.groups, shifts + r * mm.groups);
    } else {
      quantizeRowPortable(row, mm.k, mm.groups, qr, scales + r * mm.groups, shifts + r * mm.groups);
    }
  }
  for (int64_t block = block_begin; block < block_end; ++block) {
    if (mm.vnni) {
      panelVnni(mm, panel, rows, block, y + row0 * mm.n);
    } else {
      panelPortable(mm, panel, rows, block, y + row0 * mm.n);
    }
  }
  if (mm.activation) {
    const vec::UnaryFn activation = vec::vectorKernels().unaryFn(*mm.activation);
    const int64_t column0 = block_begin * kBlock;
    const int64_t columns = std::min(mm.n, block_end * kBlock) - column0;
    for (int64_t r = 0; r < rows; ++r) {
      float* piece = y + (row0 + r) * mm.n + column0;
      activation(piece, piece, columns, mm.alpha, mm.beta);
    }
  }
}

// ------------------------------------------------------------ the kernel

using namespace checks;

struct DynamicInt8MatMulState final : KernelState {
  std::unique_ptr<DynamicInt8MatMul> matmul;
  int64_t rows = 0;
};

// kiln.DynamicInt8MatMul(x f32 [..., k], w i8 [k, n], w_scale f32 [n][,
// bias f32 [n]]) -> f32 [..., n]; w, w_scale and bias constants; the
// attributes activation, activation_alpha and activation_beta
// (core/fused_activation.h) as kiln.FusedMatMul's.
std::unique_ptr<KernelState> prepareKernel(const KernelSetup& setup) {
  constexpr std::string_view op = "kiln.DynamicInt8MatMul";
  expectCounts(op, setup, 3, 4, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& w = setup.inputs[1];
  expectDType(op, "input 0", x, DType::kF32);
  expectDType(op, "the weights (input 1)", w, DType::kI8);
  expectDType(op, "the weight scales (input 2)", setup.inputs[2], DType::kF32);
  if (w.shape.size() != 2) throw UsageError(fmt::format("{}: the weights must be 2-D [k, n], found {}", op, typeText(w)));
  const int64_t k = w.shape[0];
  const int64_t n = w.shape[1];
  if (x.shape.empty() || x.shape.back() != k) {
    throw UsageError(fmt::format("{}: input 0 {} must end in k = {}", op, typeText(x), k));
  }
  if (static_cast<int64_t>(setup.inputs[2].numElements()) != n) {
    throw UsageError(fmt::format("{}: the weight scales {} must hold n = {} values", op, typeText(setup.inputs[2]), n));
  }
  const bool has_bias = present(inputAt(setup, 3));
  if (has_bias) {
    expectDType(op, "the bias (input 3)", setup.inputs[3], DType::kF32);
    if (static_cast<int64_t>(setup.inputs[3].numElements()) != n) {
      throw UsageError(fmt::format("{}: the bias {} must hold n = {} values", op, typeText(setup.inputs[3]), n));
    }
  }
  std::vector<int64_t> out_shape = x.shape;
  out_shape.back() = n;
  expectOutput(op, setup, 0, DType::kF32, out_shape);
  const auto* w_bytes = reinterpret_cast<const int8_t*>(requireConstantInput(op, setup, 1, "the weights"));
  const auto* scales = reinterpret_cast<const float*>(requireConstantInput(op, setup, 2, "the weight scales"));
  const auto* bias = has_bias ? reinterpret_cast<const float*>(requireConstantInput(op, setup, 3, "the bias")) : nullptr;
  auto state = std::make_unique<DynamicInt8MatMulState>();
  state->matmul = prepareDynamicInt8MatMul(k, n, w_bytes, scales, bias);
  const std::string activation = setup.params.getString(std::string(kActivationAttribute), "");
  const std::optional<FusedActivation> kind = parseFusedActivation(activation);
  if (!kind || (*kind != FusedActivation::kNone && !vec::unaryForActivation(*kind))) {
    throw UsageError(fmt::format("{}: activation '{}' is not one this kernel applies", op, activation));
  }
  state->matmul->activation = vec::unaryForActivation(*kind);
  state->matmul->alpha = static_cast<float>(setup.params.getFloat(std::string(kActivationAlphaAttribute), 0.0));
  state->matmul->beta = static_cast<float>(setup.params.getFloat(std::string(kActivationBetaAttribute), 0.0));
  state->rows = k == 0 ? 0 : static_cast<int64_t>(x.numElements()) / k;
  return state;
}

void runKernel(const KernelCall& call) {
  const auto& s = static_cast<const DynamicInt8MatMulState&>(*call.state);
  runDynamicInt8MatMul(*s.matmul, s.rows, call.inputs[0].as<const float>(), call.outputs[0].as<float>());
}

}  // namespace

bool dynamicInt8UsesVnni() {
  static const bool vnni = vec::vectorKernels().isa == vec::Isa::kAvx512 && __builtin_cpu_supports("avx512vnni") &&
                           __builtin_cpu_supports("avx512bw");
  return vnni;
}

std::unique_ptr<DynamicInt8MatMul> prepareDynamicInt8MatMul(int64_t k, int64_t n, const int8_t* w,
                                                            const float* w_scale, const float* bias,
                                                            bool allow_vnni) {
  if (k <= 0 || n <= 0 || k > kDynamicInt8MaxDepth) {
    throw UsageError(fmt::format("kiln.DynamicInt8MatMul: weights [{}, {}] unsupported: k must be in [1, {}] and n at "
                                 "least 1",
                                 k, n, kDynamicInt8MaxDepth));
  }
  auto mm = std::make_unique<DynamicInt8MatMul>();
  mm->k = k;
  mm->n = n;
  mm->groups = (k + kGroup - 1) / kGroup;
  mm->blocks = (n + kBlock - 1) / kBlock;
  mm->vnni = allow_vnni && dynamicInt8UsesVnni();
  const int64_t depth = mm->groups * kGroup;
  const int64_t padded_n = mm->blocks * kBlock;
  mm->w_scale.assign(static_cast<size_t>(padded_n), 0.0f);
  mm->bias.assign(static_cast<size_t>(padded_n), 0.0f);
  std::copy(w_scale, w_scale + n, mm->w_scale.begin());
  if (bias != nullptr) std::copy(bias, bias + n, mm->bias.begin());
  mm->column_sums.assign(static_cast<size_t>(mm->blocks * mm->groups * kBlock), 0.0f);
  for (int64_t col = 0; col < n; ++col) {
    for (int64_t g = 0; g < mm->groups; ++g) {
      int32_t sum = 0;
      for (int64_t i = g * kGroup; i < std::min(k, (g + 1) * kGroup); ++i) sum += w[i * n + col];
      mm->column_sums[static_cast<size_t>(((col / kBlock) * mm->groups + g) * kBlock + col % kBlock)] =
          static_cast<float>(sum);
    }
  }
  if (mm->vnni) {
    mm->packed.assign(static_cast<size_t>(mm->blocks * depth * kBlock), 0);
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t col = 0; col < n; ++col) {
        const int64_t block = col / kBlock;
        const size_t at = static_cast<size_t>(((block * (depth / 4) + i / 4) * kBlock + col % kBlock) * 4 + i % 4);
        mm->packed[at] = w[i * n + col];
      }
    }
  } else {
    mm->plain.assign(w, w + k * n);
  }
  return mm;
}

void runDynamicInt8MatMul(const DynamicInt8MatMul& mm, int64_t m, const float* x, float* y) {
  if (m <= 0) return;  // an empty batch
  const int64_t panels = (m + kPanelRows - 1) / kPanelRows;
  int64_t threads = 1;
#if defined(_OPENMP)
  threads = omp_get_max_threads();
#endif
  // Few rows (a decoder step, a short sequence): split the columns as well,
  // each piece quantizing its rows again (k values per row, against k x 32
  // products per row and block).
  const int64_t chunks = panels >= 2 * threads ? 1 : std::min(mm.blocks, (2 * threads + panels - 1) / panels);
  const int64_t blocks_per_chunk = (mm.blocks + chunks - 1) / chunks;
  parallelForItems(panels * chunks, kPanelRows * mm.k * blocks_per_chunk, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t panel = item / chunks;
      const int64_t chunk = item % chunks;
      const int64_t row0 = panel * kPanelRows;
      runPanel(mm, x, y, row0, std::min(kPanelRows, m - row0), chunk * mm.blocks / chunks,
               (chunk + 1) * mm.blocks / chunks);
    }
  });
}

void registerDynamicInt8Kernels(KernelRegistry& registry) {
  registry.add({"kiln.DynamicInt8MatMul", prepareKernel, runKernel});
}

}  // namespace kiln

#include "kernels/cpu/exact_int_gemm.h"

#include <dnnl.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_kernels.h"

namespace kiln {
namespace {

// The K block whose partial sums stay exact in f32 (see the header).
constexpr int64_t kExactBlock = 256;

float integerAt(DType dtype, const std::byte* data, uint64_t i) {
  return dtype == DType::kU8 ? static_cast<float>(reinterpret_cast<const uint8_t*>(data)[i])
                             : static_cast<float>(reinterpret_cast<const int8_t*>(data)[i]);
}

}  // namespace

bool cpuHasVnni() {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const auto has = [isa](dnnl_cpu_isa_t bits) { return (isa & static_cast<unsigned>(bits)) == static_cast<unsigned>(bits); };
  return has(dnnl_cpu_isa_avx512_core_vnni) || has(dnnl_cpu_isa_avx2_vnni);
}

DynamicQuantization quantizeDynamic(const float* x, int64_t n, uint8_t* y) {
  const vec::VectorKernels& v = vec::vectorKernels();
  // The range, over up to kRangeBlocks blocks of x on the threads; it always
  // holds 0 (ONNX). A NaN anywhere makes it [0, 0], as std::min(0, NaN) and
  // std::max(0, NaN) over all of x would.
  constexpr int64_t kRangeBlocks = 64;
  const int64_t block = std::max<int64_t>((n + kRangeBlocks - 1) / kRangeBlocks, 4096);
  const int64_t blocks = n > 0 ? (n + block - 1) / block : 0;
  float block_lo[kRangeBlocks], block_hi[kRangeBlocks];
  parallelForItems(blocks, 2 * block, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t count = std::min(block, n - b * block);
      block_lo[b] = v.min(x + b * block, count);
      block_hi[b] = v.max(x + b * block, count);
    }
  });
  float lo = 0.0f, hi = 0.0f;
  bool nan = false;
  for (int64_t b = 0; b < blocks; ++b) {
    nan = nan || std::isnan(block_lo[b]) || std::isnan(block_hi[b]);
    lo = std::min(lo, block_lo[b]);
    hi = std::max(hi, block_hi[b]);
  }
  if (nan) lo = hi = 0.0f;
  DynamicQuantization q;
  q.scale = (hi == lo ? 1.0f : hi - lo) / 255.0f;
  const float zero = std::nearbyint(std::clamp(0.0f - lo / q.scale, 0.0f, 255.0f));
  q.zero = static_cast<uint8_t>(zero);
  parallelForElements(n, [&](int64_t begin, int64_t end) { v.quantize8(x + begin, y + begin, end - begin, q.scale, zero, false); });
  return q;
}

std::unique_ptr<ExactIntGemm> prepareExactIntGemm(DType a_dtype, int64_t m, int64_t n, int64_t k,
                                                  std::vector<int64_t> a_offsets,
                                                  std::vector<int64_t> b_offsets, DType b_dtype, const std::byte* b,
                                                  uint64_t b_elements, const std::byte* b_zero, int64_t b_zero_stride) {
  auto gemm = std::make_unique<ExactIntGemm>();
  gemm->m = m;
  gemm->n = n;
  gemm->k = k;
  gemm->a_offsets = std::move(a_offsets);
  gemm->b_offsets = std::move(b_offsets);
  if (b_zero_stride == 0 && cpuHasVnni()) {
    // u8 weights become i8 exactly: (b - zero) = ((b - 128) - (zero - 128)).
    const int shift = b_dtype == DType::kU8 ? 128 : 0;
    gemm->vnni = true;
    gemm->b_i8.resize(b_elements);
    for (uint64_t i = 0; i < b_elements; ++i) gemm->b_i8[i] = static_cast<int8_t>(integerAt(b_dtype, b, i) - shift);
    gemm->b_zero = static_cast<int8_t>((b_zero == nullptr ? 0 : integerAt(b_dtype, b_zero, 0)) - shift);
    // Batches that share B and follow each other in A are one product of
    // batch * m rows.
    bool one_product = true;
    for (size_t batch = 0; batch < gemm->a_offsets.size(); ++batch) {
      one_product = one_product && gemm->b_offsets[batch] == gemm->b_offsets[0] &&
                    gemm->a_offsets[batch] == static_cast<int64_t>(batch) * m * k;
    }
    if (one_product) {
      gemm->a_dtype = a_dtype;
      gemm->primitive = prepareInt8MatMul(static_cast<int64_t>(gemm->a_offsets.size()) * m, n, k, a_dtype,
                                          gemm->b_i8.data() + gemm->b_offsets[0], gemm->b_zero);
    }
    return gemm;
  }
  gemm->b.resize(b_elements);
  for (uint64_t i = 0; i < b_elements; ++i) {
    const uint64_t column = i % static_cast<uint64_t>(n);
    const float zero = b_zero == nullptr ? 0.0f : integerAt(b_dtype, b_zero, b_zero_stride == 0 ? 0 : column);
    gemm->b[i] = integerAt(b_dtype, b, i) - zero;
  }
  gemm->a.resize(static_cast<size_t>(m * k));  // (not on the vnni path)
  gemm->block.resize(static_cast<size_t>(m * n));
  return gemm;
}

bool runExactIntGemm(const ExactIntGemm& gemm, DType a_dtype, const std::byte* a, int32_t a_zero, int32_t* y) {
  if (gemm.primitive && a_dtype == gemm.a_dtype) {
    runInt8MatMul(*gemm.primitive, a, a_zero, y);
    return true;
  }
  if (gemm.busy.exchange(true, std::memory_order_acquire)) return false;
  const int64_t m = gemm.m, n = gemm.n, k = gemm.k;
  if (gemm.vnni) {
    const int32_t no_offset = 0;
    for (size_t batch = 0; batch < gemm.a_offsets.size(); ++batch) {
      const int8_t* b = gemm.b_i8.data() + gemm.b_offsets[batch];
      int32_t* out = y + static_cast<int64_t>(batch) * m * n;
      if (a_dtype == DType::kU8) {
        dnnl_gemm_u8s8s32('N', 'N', 'F', m, n, k, 1.0f, reinterpret_cast<const uint8_t*>(a) + gemm.a_offsets[batch], k,
                          static_cast<uint8_t>(a_zero), b, n, gemm.b_zero, 0.0f, out, n, &no_offset);
      } else {
        dnnl_gemm_s8s8s32('N', 'N', 'F', m, n, k, 1.0f, reinterpret_cast<const int8_t*>(a) + gemm.a_offsets[batch], k,
                          static_cast<int8_t>(a_zero), b, n, gemm.b_zero, 0.0f, out, n, &no_offset);
      }
    }
    gemm.busy.store(false, std::memory_order_release);
    return true;
  }
  const float zero = static_cast<float>(a_zero);
  for (size_t batch = 0; batch < gemm.a_offsets.size(); ++batch) {
    const uint64_t a_at = static_cast<uint64_t>(gemm.a_offsets[batch]);
    for (int64_t i = 0; i < m * k; ++i) gemm.a[static_cast<size_t>(i)] = integerAt(a_dtype, a, a_at + i) - zero;
    const float* b = gemm.b.data() + gemm.b_offsets[batch];
    int32_t* out = y + static_cast<int64_t>(batch) * m * n;
    for (int64_t p0 = 0; p0 < k; p0 += kExactBlock) {
      const int64_t depth = std::min(kExactBlock, k - p0);
      dnnl_sgemm('N', 'N', m, n, depth, 1.0f, gemm.a.data() + p0, k, b + p0 * n, n, 0.0f, gemm.block.data(), n);
      for (int64_t i = 0; i < m * n; ++i) {
        const auto sum = static_cast<int32_t>(gemm.block[static_cast<size_t>(i)]);
        out[i] = p0 == 0 ? sum : out[i] + sum;
      }
    }
  }
  gemm.busy.store(false, std::memory_order_release);
  return true;
}

}  // namespace kiln

// How fast this CPU runs the instructions reduced precision would use, per
// core, against f32 FMA: AVX-512 FMA (f32), VNNI's vpdpbusd (8-bit dot
// products into i32) and AVX-512 BF16's vdpbf16ps (bf16 pairs into f32).
//
//   build/release/bench/isa_throughput_bench
//
// Each loop keeps 24 independent accumulators busy, so it measures
// throughput, not latency. The figures decide kiln's precision strategy
// (docs/performance.md): vpdpbusd does 4x the multiplies of an FMA per
// instruction and vdpbf16ps 2x, so each pays only where it retires at more
// than a quarter (int8) or a half (bf16) of FMA's rate. On the Sapphire
// Rapids VM kiln is measured on (no AMX exposed), vpdpbusd retires at about
// half FMA's rate (int8 products 2.2x f32's) and vdpbf16ps at a quarter
// (bf16 products 0.5x f32's: slower than f32 there).
//
// GCC 12 reports its own AVX-512 reduce intrinsics (the _mm512_undefined_*
// idiom inside them) as using uninitialized values: a false positive,
// silenced before <immintrin.h> comes in.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <chrono>
#include <cstdio>

namespace {

constexpr int kChains = 24;
constexpr long kSteps = 10'000'000;

template <typename Body>
double secondsFor(Body body) {
  body(kSteps / 10);  // warm up (frequency, caches)
  const auto start = std::chrono::steady_clock::now();
  body(kSteps);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

__attribute__((target("avx512f,fma"))) float fma(long steps) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
  for (long s = 0; s < steps; ++s) {
    _Pragma("GCC unroll 24") for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a), "+v"(b));
  }
  float sum = 0;
  for (int i = 0; i < kChains; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  return sum;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) float vnni(long steps) {
  __m512i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i a = _mm512_set1_epi32(0x01020304), b = _mm512_set1_epi32(0x01010101);
  for (long s = 0; s < steps; ++s) {
    _Pragma("GCC unroll 24") for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    __asm__ volatile("" : "+v"(a), "+v"(b));
  }
  long sum = 0;
  for (int i = 0; i < kChains; ++i) sum += _mm512_reduce_add_epi32(acc[i]);
  return static_cast<float>(sum);
}

__attribute__((target("avx512f,avx512bf16"))) float bf16(long steps) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x3f803f81);
  for (long s = 0; s < steps; ++s) {
    _Pragma("GCC unroll 24") for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a), "+v"(b));
  }
  float sum = 0;
  for (int i = 0; i < kChains; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  return sum;
}

volatile float sink;

}  // namespace

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) {
    std::puts("no AVX-512 on this CPU: nothing to measure");
    return 0;
  }
  const double instructions = static_cast<double>(kSteps) * kChains;
  const double t_fma = secondsFor([](long n) { sink = fma(n); });
  std::printf("f32 FMA (vfmadd231ps zmm):  %.2f G instructions/s, %6.1f G multiply-adds/s\n", instructions / t_fma / 1e9,
              16 * instructions / t_fma / 1e9);
  if (__builtin_cpu_supports("avx512vnni")) {
    const double t = secondsFor([](long n) { sink = vnni(n); });
    std::printf("int8 VNNI (vpdpbusd zmm):   %.2f G instructions/s, %6.1f G multiply-adds/s = %.2fx f32\n",
                instructions / t / 1e9, 64 * instructions / t / 1e9, (64 / t) / (16 / t_fma));
  } else {
    std::puts("int8 VNNI: not on this CPU");
  }
  if (__builtin_cpu_supports("avx512bf16")) {
    const double t = secondsFor([](long n) { sink = bf16(n); });
    std::printf("bf16 (vdpbf16ps zmm):       %.2f G instructions/s, %6.1f G multiply-adds/s = %.2fx f32\n",
                instructions / t / 1e9, 32 * instructions / t / 1e9, (32 / t) / (16 / t_fma));
  } else {
    std::puts("bf16 (AVX-512 BF16): not on this CPU");
  }
  return 0;
}

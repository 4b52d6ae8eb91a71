// Double-precision references for MatMul and Gemm, shared by the tests of
// the plain kernels (matmul_test.cc) and of their fused forms
// (fused_matmul_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/kernels/kernel_test_util.h"

namespace kiln::testing {

// f32 products accumulate rounding over K terms: compare against the double
// result within this fraction of sum |a_ik b_kj| (+ |beta c|).
constexpr double kProductTolerance = 1e-5;

struct Reference {
  std::vector<double> values;
  std::vector<double> magnitudes;  // the scale each value's rounding error is relative to
};

inline ::testing::AssertionResult matches(const std::vector<float>& got, const Reference& want) {
  if (got.size() != want.values.size()) {
    return ::testing::AssertionFailure() << "got " << got.size() << " elements, want " << want.values.size();
  }
  size_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want.values[i]) > kProductTolerance * want.magnitudes[i] + 1e-30) {
      if (mismatches++ == 0) {
        first = "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " +
                std::to_string(want.values[i]);
      }
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << got.size() << " elements differ; first: " << first;
}

// ------------------------------------------------------------------- MatMul

// numpy.matmul, the long way.
inline std::vector<int64_t> matmulShape(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const std::vector<int64_t> a_batch(a.begin(), a.end() - (a.size() == 1 ? 1 : 2));
  const std::vector<int64_t> b_batch(b.begin(), b.end() - (b.size() == 1 ? 1 : 2));
  std::vector<int64_t> out = broadcastShape(a_batch, b_batch);
  if (a.size() > 1) out.push_back(a[a.size() - 2]);
  if (b.size() > 1) out.push_back(b.back());
  return out;
}

inline Reference matmulReference(const std::vector<int64_t>& a_shape, const std::vector<float>& a,
                                 const std::vector<int64_t>& b_shape, const std::vector<float>& b) {
  std::vector<int64_t> a2 = a_shape;
  std::vector<int64_t> b2 = b_shape;
  if (a2.size() == 1) a2.insert(a2.begin(), 1);
  if (b2.size() == 1) b2.push_back(1);
  const int64_t m = a2[a2.size() - 2], k = a2.back(), n = b2.back();
  const std::vector<int64_t> a_batch(a2.begin(), a2.end() - 2);
  const std::vector<int64_t> b_batch(b2.begin(), b2.end() - 2);
  const std::vector<int64_t> batch = broadcastShape(a_batch, b_batch);
  Reference ref;
  for (size_t t = 0; t < elementCount(batch); ++t) {
    const size_t ia = broadcastIndex(batch, a_batch, t);
    const size_t ib = broadcastIndex(batch, b_batch, t);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0, magnitude = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double product = static_cast<double>(a[ia * m * k + i * k + kk]) * b[ib * k * n + kk * n + j];
          sum += product;
          magnitude += std::abs(product);
        }
        ref.values.push_back(sum);
        ref.magnitudes.push_back(magnitude);
      }
    }
  }
  return ref;
}

// --------------------------------------------------------------------- Gemm

struct GemmCase {
  bool trans_a;
  bool trans_b;
  std::vector<int64_t> c_shape;  // empty with has_c false: no C
  bool has_c;
  float alpha;
  float beta;
  bool constant_b;
  bool constant_c;
};

inline Reference gemmReference(const GemmCase& g, int64_t m, int64_t k, int64_t n, const std::vector<float>& a,
                               const std::vector<float>& b, const std::vector<float>& c) {
  Reference ref;
  const std::vector<int64_t> mn = {m, n};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double av = g.trans_a ? a[kk * m + i] : a[i * k + kk];
        const double bv = g.trans_b ? b[j * k + kk] : b[kk * n + j];
        sum += av * bv;
        magnitude += std::abs(av * bv);
      }
      double value = g.alpha * sum;
      magnitude *= std::abs(g.alpha);
      if (g.has_c) {
        const double cv = g.beta * c[broadcastIndex(mn, g.c_shape, static_cast<size_t>(i * n + j))];
        value += cv;
        magnitude += std::abs(cv);
      }
      ref.values.push_back(value);
      ref.magnitudes.push_back(magnitude);
    }
  }
  return ref;
}

}  // namespace kiln::testing

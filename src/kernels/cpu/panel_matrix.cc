#include "kernels/cpu/panel_matrix.h"

#include <algorithm>

namespace kiln {

size_t panelsSize(int64_t k, int64_t n) { return static_cast<size_t>((n + kPanel - 1) / kPanel * kPanel * k); }

void packPanels(const float* b, int64_t k, int64_t n, int64_t row_stride, int64_t column_stride, float* panels) {
  std::fill(panels, panels + panelsSize(k, n), 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    float* column = panels + (j / kPanel) * kPanel * k + j % kPanel;
    for (int64_t i = 0; i < k; ++i) column[i * kPanel] = b[i * row_stride + j * column_stride];
  }
}

void panelProduct(const vec::VectorKernels& v, const float* a, int64_t lda, const float* panels, int64_t k,
                  int64_t begin, int64_t end, float* c, int64_t ldc, int64_t m, bool backward) {
  const auto product = [&](int64_t from, int64_t to) {  // within one panel
    v.matmulAccumulate(a, lda, panels + (from / kPanel) * kPanel * k + from % kPanel, kPanel, c + (from - begin), ldc,
                       m, to - from, k);
  };
  if (!backward) {
    for (int64_t j = begin; j < end; j = std::min(end, (j / kPanel + 1) * kPanel)) {
      product(j, std::min(end, (j / kPanel + 1) * kPanel));
    }
  } else {
    for (int64_t j = end; j > begin; j = std::max(begin, (j - 1) / kPanel * kPanel)) {
      product(std::max(begin, (j - 1) / kPanel * kPanel), j);
    }
  }
}

}  // namespace kiln

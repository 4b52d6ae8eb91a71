#include "kernels/cuda/copy_codegen.h"

#include <fmt/format.h>

#include <iterator>
#include <vector>

namespace kiln::cuda {
namespace {

struct Dim {
  int64_t size;
  int64_t stride;  // in elements of x
};

// The copy's dimensions without those of size 1, adjacent ones merged
// where the outer one's stride spans the inner one (they move together).
std::vector<Dim> mergedDims(const StridedCopy& copy) {
  std::vector<Dim> dims;
  for (int d = 0; d < copy.rank; ++d) {
    if (copy.dims[d] == 1) continue;
    if (!dims.empty() && dims.back().stride == copy.strides[d] * copy.dims[d]) {
      dims.back() = {dims.back().size * copy.dims[d], copy.strides[d]};
    } else {
      dims.push_back({copy.dims[d], copy.strides[d]});
    }
  }
  return dims;
}

const char* typeOf(int element_bytes) {
  switch (element_bytes) {
    case 1: return "unsigned char";
    case 2: return "unsigned short";
    case 4: return "unsigned int";
    case 8: return "unsigned long long";
    default: return nullptr;
  }
}

void writeKernel(std::string& out, const std::vector<Dim>& dims, int64_t offset, uint64_t elements, int width) {
  fmt::format_to(std::back_inserter(out),
                 "extern \"C\" __global__ void __launch_bounds__({0}) kiln_copy_v{1}(CopyArgs a) {{\n"
                 "  const unsigned t = blockIdx.x * {0}u + threadIdx.x;\n"
                 "  if (t >= {2}u) return;\n"
                 "  const unsigned e = t * {1}u;\n"
                 "  long long offset = {3}ll;\n",
                 kCopyBlock, width, elements / static_cast<uint64_t>(width), offset);
  if (!dims.empty()) out += "  unsigned r = e;\n";
  for (size_t d = dims.size(); d-- > 0;) {
    if (d == 0) {
      fmt::format_to(std::back_inserter(out), "  offset += static_cast<long long>(r) * {}ll;\n", dims[d].stride);
    } else {
      fmt::format_to(std::back_inserter(out),
                     "  offset += static_cast<long long>(r % {0}u) * {1}ll; r /= {0}u;\n", dims[d].size,
                     dims[d].stride);
    }
  }
  if (width == 4) {
    out += "  reinterpret_cast<V*>(a.y)[t] = *reinterpret_cast<const V*>(reinterpret_cast<const T*>(a.x) + offset);\n}\n";
  } else {
    out += "  reinterpret_cast<T*>(a.y)[e] = reinterpret_cast<const T*>(a.x)[offset];\n}\n";
  }
}

}  // namespace

std::optional<CopySource> stridedCopySource(const StridedCopy& copy, uint64_t elements, int element_bytes) {
  const char* type = typeOf(element_bytes);
  if (type == nullptr || elements == 0 || elements >= (1ull << 31)) return std::nullopt;
  const std::vector<Dim> dims = mergedDims(copy);
  CopySource source;
  // Four elements of 4 bytes at a time: the innermost dimension contiguous
  // in x, a multiple of four long, and every start of four aligned to four.
  bool vector = element_bytes == 4 && !dims.empty() && dims.back().stride == 1 && dims.back().size % 4 == 0 &&
                copy.offset % 4 == 0;
  for (size_t d = 0; vector && d + 1 < dims.size(); ++d) vector = dims[d].stride % 4 == 0;
  source.vector_width = vector ? 4 : 1;
  fmt::format_to(std::back_inserter(source.text),
                 "// kiln: a strided copy of {} elements of {} bytes\n"
                 "typedef {} T;\n"
                 "struct __align__(16) V {{ T v[4]; }};\n"
                 "struct CopyArgs {{ const void* x; void* y; }};  // copy_codegen.h\n",
                 elements, element_bytes, type);
  writeKernel(source.text, dims, copy.offset, elements, 1);
  if (vector) writeKernel(source.text, dims, copy.offset, elements, 4);
  return source;
}

}  // namespace kiln::cuda

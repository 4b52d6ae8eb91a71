#include "kernels/cuda/elementwise_codegen.h"

#include <fmt/format.h>

#include <array>
#include <bit>
#include <string_view>

#include "core/elementwise_program.h"

namespace kiln::cuda {
namespace {

// Each op's expression as source text, from the definition the interpreter
// kernels compile (elementwise_ops.inc).
struct OpText {
  std::string_view name;
  std::string_view expression;
};
constexpr OpText kOpTexts[] = {
#define KILN_ELEMENTWISE_OP(name, expression) {#name, #expression},
#include "kernels/cuda/elementwise_ops.inc"
#undef KILN_ELEMENTWISE_OP
};

std::string_view expressionOf(ElementwiseOp op) {
  for (const OpText& text : kOpTexts) {
    if (text.name == elementwiseOpName(op)) return text.expression;
  }
  return {};
}

// An exact float literal (NaN and infinities included).
std::string literal(float value) { return fmt::format("__int_as_float(0x{:08x})", std::bit_cast<uint32_t>(value)); }

// How the kernel finds input k's elements.
enum class Access {
  kScalar,     // one element, for every output
  kFull,       // the output's shape: element e
  kRow,        // broadcast, contiguous along the innermost dimension
  kRepeated,   // broadcast, one element along the innermost dimension
};

struct Plan {
  int inputs = 0;
  int rank = 0;
  std::array<Access, kMaxElementwiseInputs> access{};
  bool needs_coordinates = false;
  bool vectorizable = false;
};

Plan plan(const DeviceProgram& program, const Indexing& indexing, uint64_t elements) {
  Plan p;
  p.inputs = program.inputs;
  p.rank = indexing.direct ? 0 : indexing.rank;
  p.vectorizable = elements % 4 == 0;
  for (int k = 0; k < p.inputs; ++k) {
    if (indexing.scalar[k]) {
      p.access[k] = Access::kScalar;
      continue;
    }
    bool full = true;
    int64_t contiguous = 1;
    for (int d = p.rank - 1; d >= 0; --d) {
      full = full && indexing.strides[k][d] == contiguous;
      contiguous *= indexing.out_dims[d];
    }
    if (full) {
      p.access[k] = Access::kFull;
      continue;
    }
    p.needs_coordinates = true;
    const int64_t inner = indexing.strides[k][p.rank - 1];
    p.access[k] = inner == 0 ? Access::kRepeated : Access::kRow;
    // Four lanes share their outer coordinates when the innermost size is
    // a multiple of four; a row's 16-byte load needs its start aligned.
    bool aligned = inner == 0 || inner == 1;
    for (int d = 0; d + 1 < p.rank && inner == 1; ++d) aligned = aligned && indexing.strides[k][d] % 4 == 0;
    p.vectorizable = p.vectorizable && aligned && indexing.out_dims[p.rank - 1] % 4 == 0;
  }
  return p;
}

// The offset of input k's element for the coordinates c0..c{rank-1}.
std::string offsetOf(const Indexing& indexing, const Plan& p, int k) {
  std::string sum;
  for (int d = 0; d < p.rank; ++d) {
    const int64_t stride = indexing.strides[k][d];
    if (stride == 0) continue;
    if (!sum.empty()) sum += " + ";
    sum += stride == 1 ? fmt::format("c{}", d) : fmt::format("c{} * {}u", d, stride);
  }
  return sum.empty() ? "0u" : sum;
}

void writeKernel(std::string& out, const DeviceProgram& program, const Indexing& indexing, const Plan& p,
                 uint64_t elements, int width) {
  const uint64_t threads = elements / static_cast<uint64_t>(width);
  fmt::format_to(std::back_inserter(out),
                 "extern \"C\" __global__ void __launch_bounds__({}) kiln_elementwise_v{}(Pointers a) {{\n"
                 "  const unsigned t = blockIdx.x * {}u + threadIdx.x;\n"
                 "  if (t >= {}u) return;\n"
                 "  const unsigned e = t * {}u;\n",
                 kElementwiseBlock, width, kElementwiseBlock, threads, width);
  if (p.needs_coordinates) {
    out += "  unsigned r = e;\n";
    for (int d = p.rank - 1; d > 0; --d) {
      fmt::format_to(std::back_inserter(out), "  const unsigned c{0} = r % {1}u; r /= {1}u;\n", d,
                     indexing.out_dims[d]);
    }
    out += "  const unsigned c0 = r;\n";
  }
  const bool vector = width == 4;
  for (int k = 0; k < p.inputs; ++k) {
    switch (p.access[k]) {
      case Access::kScalar: fmt::format_to(std::back_inserter(out), "  const float x{0} = a.in[{0}][0];\n", k); break;
      case Access::kFull:
        if (vector) {
          fmt::format_to(std::back_inserter(out),
                         "  const float4 x{0} = *reinterpret_cast<const float4*>(a.in[{0}] + e);\n", k);
        } else {
          fmt::format_to(std::back_inserter(out), "  const float x{0} = a.in[{0}][e];\n", k);
        }
        break;
      case Access::kRow:
        if (vector) {
          fmt::format_to(std::back_inserter(out),
                         "  const float4 x{0} = *reinterpret_cast<const float4*>(a.in[{0}] + ({1}));\n", k,
                         offsetOf(indexing, p, k));
        } else {
          fmt::format_to(std::back_inserter(out), "  const float x{0} = a.in[{0}][{1}];\n", k, offsetOf(indexing, p, k));
        }
        break;
      case Access::kRepeated:
        fmt::format_to(std::back_inserter(out), "  const float x{0} = a.in[{0}][{1}];\n", k, offsetOf(indexing, p, k));
        break;
    }
  }
  static constexpr const char* kLane[4] = {".x", ".y", ".z", ".w"};
  const int results = program.inputs + program.immediates;
  for (int lane = 0; lane < width; ++lane) {
    auto slot = [&](int s) -> std::string {
      if (s < program.inputs) {
        const bool split = vector && (p.access[s] == Access::kFull || p.access[s] == Access::kRow);
        return fmt::format("x{}{}", s, split ? kLane[lane] : "");
      }
      if (s < results) return literal(program.immediate[s - program.inputs]);
      return fmt::format("l{}_{}", lane, s - results);
    };
    for (int j = 0; j < program.ops; ++j) {
      const auto op = static_cast<ElementwiseOp>(program.op[j]);
      fmt::format_to(std::back_inserter(out), "  const float l{}_{} = kiln_{}({}, {}, {}, {});\n", lane, j,
                     elementwiseOpName(op), slot(program.a[j]), program.b[j] >= 0 ? slot(program.b[j]) : "0.0f",
                     literal(program.alpha[j]), literal(program.beta[j]));
    }
  }
  const int last = program.ops - 1;
  if (vector) {
    fmt::format_to(std::back_inserter(out),
                   "  *reinterpret_cast<float4*>(a.out + e) = make_float4(l0_{0}, l1_{0}, l2_{0}, l3_{0});\n}}\n",
                   last);
  } else {
    fmt::format_to(std::back_inserter(out), "  a.out[e] = l0_{};\n}}\n", last);
  }
}

}  // namespace

std::optional<ElementwiseSource> elementwiseSource(const DeviceProgram& program, const Indexing& indexing,
                                                   uint64_t elements) {
  if (elements == 0 || elements >= (1ull << 31) || program.ops < 1 || program.inputs < 1) return std::nullopt;
  for (int j = 0; j < program.ops; ++j) {
    if (program.op[j] >= static_cast<uint8_t>(ElementwiseOp::kCount)) return std::nullopt;
  }
  const Plan p = plan(program, indexing, elements);
  ElementwiseSource source;
  source.vector_width = p.vectorizable ? 4 : 1;
  std::string& out = source.text;
  fmt::format_to(std::back_inserter(out),
                 "// kiln: an elementwise program of {} instructions over {} elements\n"
                 "#define NAN __int_as_float(0x7fffffff)\n"
                 "struct Pointers {{ const float* in[{}]; float* out; }};  // elementwise_launch.h\n",
                 program.ops, elements, kMaxElementwiseInputs);
  bool used[static_cast<size_t>(ElementwiseOp::kCount)] = {};
  for (int j = 0; j < program.ops; ++j) used[program.op[j]] = true;
  for (size_t op = 0; op < std::size(used); ++op) {
    if (!used[op]) continue;
    const auto which = static_cast<ElementwiseOp>(op);
    fmt::format_to(std::back_inserter(out),
                   "__device__ __forceinline__ float kiln_{}(float x, float y, float alpha, float beta) {{\n"
                   "  (void)y; (void)alpha; (void)beta;\n  return {};\n}}\n",
                   elementwiseOpName(which), expressionOf(which));
  }
  writeKernel(out, program, indexing, p, elements, 1);
  if (source.vector_width == 4) writeKernel(out, program, indexing, p, elements, 4);
  return source;
}

}  // namespace kiln::cuda

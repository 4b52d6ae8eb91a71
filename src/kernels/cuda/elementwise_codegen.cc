#include "kernels/cuda/elementwise_codegen.h"

#include <fmt/format.h>

#include <array>
#include <iterator>

#include "kernels/cuda/program_codegen.h"

namespace kiln::cuda {
namespace {

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

// Declares input k's value at `offset` as x<k>: a float, or with `vector`
// a float4 of the four elements from there. A 16-bit input (f16, bf16)
// converts as it loads; four of them are one 8-byte load.
void appendLoad(std::string& out, int k, const std::string& offset, bool vector, FloatStorage storage) {
  const char* f = loadConversion(storage);
  if (storage == FloatStorage::kF32 && !vector) {
    fmt::format_to(std::back_inserter(out), "  const float x{0} = a.in[{0}][{1}];\n", k, offset);
  } else if (storage == FloatStorage::kF32) {
    fmt::format_to(std::back_inserter(out), "  const float4 x{0} = *reinterpret_cast<const float4*>(a.in[{0}] + ({1}));\n",
                   k, offset);
  } else if (!vector) {
    fmt::format_to(std::back_inserter(out),
                   "  const float x{0} = {2}(reinterpret_cast<const unsigned short*>(a.in[{0}])[{1}]);\n", k, offset, f);
  } else {
    fmt::format_to(std::back_inserter(out),
                   "  const uint2 r{0} = *reinterpret_cast<const uint2*>(reinterpret_cast<const unsigned short*>(a.in[{0}]) + ({1}));\n"
                   "  const float4 x{0} = make_float4({2}(r{0}.x & 0xffffu), {2}(r{0}.x >> 16), "
                   "{2}(r{0}.y & 0xffffu), {2}(r{0}.y >> 16));\n",
                   k, offset, f);
  }
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
      case Access::kScalar: appendLoad(out, k, "0u", false, indexing.storage[k]); break;
      case Access::kFull: appendLoad(out, k, "e", vector, indexing.storage[k]); break;
      case Access::kRow: appendLoad(out, k, offsetOf(indexing, p, k), vector, indexing.storage[k]); break;
      case Access::kRepeated: appendLoad(out, k, offsetOf(indexing, p, k), false, indexing.storage[k]); break;
    }
  }
  static constexpr const char* kLane[4] = {".x", ".y", ".z", ".w"};
  std::string result[4];
  for (int lane = 0; lane < width; ++lane) {
    result[lane] = appendInstructions(out, program, fmt::format("l{}", lane), [&](int k) {
      const bool split = vector && (p.access[k] == Access::kFull || p.access[k] == Access::kRow);
      return fmt::format("x{}{}", k, split ? kLane[lane] : "");
    });
  }
  const bool narrow = indexing.storage_out != FloatStorage::kF32;
  const char* f = storeConversion(indexing.storage_out);
  if (vector && narrow) {
    fmt::format_to(std::back_inserter(out),
                   "  *reinterpret_cast<uint2*>(reinterpret_cast<unsigned short*>(a.out) + e) = make_uint2("
                   "{4}({0}) | (unsigned({4}({1})) << 16), {4}({2}) | (unsigned({4}({3})) << 16));\n}}\n",
                   result[0], result[1], result[2], result[3], f);
  } else if (vector) {
    fmt::format_to(std::back_inserter(out), "  *reinterpret_cast<float4*>(a.out + e) = make_float4({}, {}, {}, {});\n}}\n",
                   result[0], result[1], result[2], result[3]);
  } else if (narrow) {
    fmt::format_to(std::back_inserter(out), "  reinterpret_cast<unsigned short*>(a.out)[e] = {}({});\n}}\n", f,
                   result[0]);
  } else {
    fmt::format_to(std::back_inserter(out), "  a.out[e] = {};\n}}\n", result[0]);
  }
}

}  // namespace

std::optional<ElementwiseSource> elementwiseSource(const DeviceProgram& program, const Indexing& indexing,
                                                   uint64_t elements) {
  if (elements == 0 || elements >= (1ull << 31) || program.ops < 1 || program.inputs < 1 || !opsAreKnown(program)) {
    return std::nullopt;
  }
  const Plan p = plan(program, indexing, elements);
  ElementwiseSource source;
  source.vector_width = p.vectorizable ? 4 : 1;
  std::string& out = source.text;
  appendPrelude(out, fmt::format("an elementwise program of {} instructions over {} elements", program.ops, elements),
                program);
  bool any_half = indexing.storage_out != FloatStorage::kF32;
  for (int k = 0; k < program.inputs; ++k) any_half = any_half || indexing.storage[k] != FloatStorage::kF32;
  if (any_half) appendHalfConversions(out);
  fmt::format_to(std::back_inserter(out), "struct Pointers {{ const float* in[{}]; float* out; }};  // elementwise_launch.h\n",
                 kMaxElementwiseInputs);
  writeKernel(out, program, indexing, p, elements, 1);
  if (source.vector_width == 4) writeKernel(out, program, indexing, p, elements, 4);
  return source;
}

}  // namespace kiln::cuda

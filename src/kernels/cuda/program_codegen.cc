#include "kernels/cuda/program_codegen.h"

#include <fmt/format.h>

#include <bit>
#include <iterator>
#include <string_view>

#include "core/elementwise_program.h"

namespace kiln::cuda {
namespace {

// Each op's expression as source text, from the definition the interpreter
// kernels compile.
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

}  // namespace

std::string floatLiteral(float value) {
  return fmt::format("__int_as_float(0x{:08x})", std::bit_cast<uint32_t>(value));
}

bool opsAreKnown(const DeviceProgram& program) {
  for (int j = 0; j < program.ops; ++j) {
    if (program.op[j] >= static_cast<uint8_t>(ElementwiseOp::kCount)) return false;
  }
  return true;
}

void appendPrelude(std::string& out, const std::string& what, const DeviceProgram& program) {
  fmt::format_to(std::back_inserter(out), "// kiln: {}\n#define NAN __int_as_float(0x7fffffff)\n", what);
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
}

void appendHalfConversions(std::string& out) {
  out +=
      "__device__ __forceinline__ float kiln_h2f(unsigned h) {\n"
      "  float f; const unsigned short s = static_cast<unsigned short>(h);\n"
      "  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(s)); return f;\n}\n"
      "__device__ __forceinline__ unsigned short kiln_f2h(float f) {\n"
      "  unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;\n}\n"
      "__device__ __forceinline__ float kiln_b2f(unsigned b) {\n"
      "  float f; const unsigned u = (b & 0xffffu) << 16;\n"
      "  asm(\"mov.b32 %0, %1;\" : \"=f\"(f) : \"r\"(u)); return f;\n}\n"
      "__device__ __forceinline__ unsigned short kiln_f2b(float f) {\n"
      "  unsigned u; asm(\"mov.b32 %0, %1;\" : \"=r\"(u) : \"f\"(f));\n"
      "  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40u);\n"
      "  return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n}\n";
}

const char* loadConversion(FloatStorage storage) { return storage == FloatStorage::kBF16 ? "kiln_b2f" : "kiln_h2f"; }
const char* storeConversion(FloatStorage storage) { return storage == FloatStorage::kBF16 ? "kiln_f2b" : "kiln_f2h"; }

std::string appendInstructions(std::string& out, const DeviceProgram& program, const std::string& prefix,
                               const std::function<std::string(int)>& input) {
  const int results = program.inputs + program.immediates;
  auto slot = [&](int s) -> std::string {
    if (s < program.inputs) return input(s);
    if (s < results) return floatLiteral(program.immediate[s - program.inputs]);
    return fmt::format("{}_{}", prefix, s - results);
  };
  for (int j = 0; j < program.ops; ++j) {
    const auto op = static_cast<ElementwiseOp>(program.op[j]);
    fmt::format_to(std::back_inserter(out), "  const float {}_{} = kiln_{}({}, {}, {}, {});\n", prefix, j,
                   elementwiseOpName(op), slot(program.a[j]), program.b[j] >= 0 ? slot(program.b[j]) : "0.0f",
                   floatLiteral(program.alpha[j]), floatLiteral(program.beta[j]));
  }
  return fmt::format("{}_{}", prefix, program.ops - 1);
}

}  // namespace kiln::cuda

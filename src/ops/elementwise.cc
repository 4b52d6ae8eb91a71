// Elementwise operators: unary maps, broadcasting binary and variadic
// operators, comparisons and logic, Where, Clip, Cast; and
// kiln.FusedElementwise, a group of them as one node.
#include <limits>
#include <optional>

#include "core/elementwise_program.h"
#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

bool isFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF64;
}

// Output = input 0's type; inputs after the first must have its dtype.
void unary(InferenceContext& context) { copyInputType(context); }

void floatUnary(InferenceContext& context) {
  if (!isFloat(context.inputType(0).dtype)) {
    context.fail("needs a floating-point input, found {}", dtypeName(context.inputType(0).dtype));
  }
  copyInputType(context);
}

void sameDTypes(const InferenceContext& context, const std::vector<size_t>& inputs) {
  const DType first = context.inputType(inputs.front()).dtype;
  for (size_t input : inputs) {
    if (context.hasInput(input) && context.inputType(input).dtype != first) {
      context.fail("input {} is {} but input {} is {}: they must match", input,
                   dtypeName(context.inputType(input).dtype), inputs.front(), dtypeName(first));
    }
  }
}

std::vector<size_t> allInputs(const InferenceContext& context) {
  std::vector<size_t> inputs(context.inputCount());
  for (size_t i = 0; i < inputs.size(); ++i) inputs[i] = i;
  return inputs;
}

// Broadcasting operator whose result has the inputs' dtype (or `result`).
void broadcasting(InferenceContext& context, std::optional<DType> result = std::nullopt) {
  const std::vector<size_t> inputs = allInputs(context);
  sameDTypes(context, inputs);
  context.output(0) = ValueType{result.value_or(context.inputType(0).dtype), broadcastInputs(context, inputs)};
}

void comparison(InferenceContext& context) { broadcasting(context, DType::kBool); }

void logical(InferenceContext& context) {
  for (size_t i = 0; i < context.inputCount(); ++i) {
    if (context.inputType(i).dtype != DType::kBool) context.fail("input {} must be bool", i);
  }
  broadcasting(context);
}

void where(InferenceContext& context) {
  if (context.inputType(0).dtype != DType::kBool) context.fail("the condition must be bool");
  sameDTypes(context, {1, 2});
  context.output(0) = ValueType{context.inputType(1).dtype, broadcastInputs(context, {0, 1, 2})};
}

void cast(InferenceContext& context) {
  const int64_t to = context.node().intAttribute("to", 0);
  if (to <= 0 || to > 255 || !isValidDType(static_cast<uint8_t>(to))) {
    context.fail("attribute 'to' is {}, not a data type kiln supports", to);
  }
  context.output(0) = ValueType{static_cast<DType>(to), context.inputType(0).shape};
}

void castLike(InferenceContext& context) {
  context.output(0) = ValueType{context.inputType(1).dtype, context.inputType(0).shape};
}

// IsNaN and IsInf take floats only.
void predicate(InferenceContext& context) {
  if (!isFloat(context.inputType(0).dtype)) {
    context.fail("needs a floating-point input, found {}", dtypeName(context.inputType(0).dtype));
  }
  context.output(0) = ValueType{DType::kBool, context.inputType(0).shape};
}

void dropout(InferenceContext& context) {
  copyInputType(context);
  if (context.outputCount() > 1) context.output(1) = ValueType{DType::kBool, context.inputType(0).shape};
}


// kiln.FusedElementwise(inputs...): the program of core/elementwise_program.h
// over f32 inputs (made by passes/elementwise_fusion.h; kernel in
// kernels/cpu/fused_elementwise.cc). The output is the broadcast of the
// inputs, f32.
void fusedElementwise(InferenceContext& context) {
  const Node& node = context.node();
  ElementwiseProgram program;
  program.input_count = context.inputCount();
  const std::string ops = node.stringAttribute(std::string(kProgramOpsAttribute), "");
  const auto parsed = parseElementwiseOps(ops);
  if (!parsed) context.fail("ops '{}' names an op that is not in the list", ops);
  program.ops = *parsed;
  program.operands = node.intsAttribute(std::string(kProgramOperandsAttribute), {});
  auto floats = [&](std::string_view key) {
    const auto it = node.attributes.find(std::string(key));
    const auto* values = it == node.attributes.end() ? nullptr : std::get_if<std::vector<float>>(&it->second);
    return values ? *values : std::vector<float>{};
  };
  program.alpha = floats(kProgramAlphaAttribute);
  program.beta = floats(kProgramBetaAttribute);
  program.immediates = floats(kProgramImmediatesAttribute);
  if (const std::string problem = checkElementwiseProgram(program); !problem.empty()) context.fail("{}", problem);
  // f32, or f16 or bf16 throughout (the cuda target's `--fp16` and `--bf16`
  // storage; the program still computes in f32); 8-bit inputs where
  // `dequantize` gives them a scale, an 8-bit output with `quantize`.
  const std::vector<float> dequantize = floats(kProgramDequantizeAttribute);
  if (!dequantize.empty() && dequantize.size() != 2 * context.inputCount()) {
    context.fail("dequantize has {} values for {} inputs; it takes two per input", dequantize.size(),
                 context.inputCount());
  }
  auto dequantized = [&](size_t i) { return !dequantize.empty() && dequantize[2 * i] != 0; };
  size_t first_float = 0;
  while (first_float + 1 < context.inputCount() && dequantized(first_float)) ++first_float;
  const DType first = context.inputType(first_float).dtype;
  const DType dtype = first == DType::kF16 || first == DType::kBF16 ? first : DType::kF32;
  for (size_t i = 0; i < context.inputCount(); ++i) {
    const DType input = context.inputType(i).dtype;
    if (dequantized(i) ? input != DType::kU8 && input != DType::kI8 : input != dtype) {
      context.fail("input {} is {}; the fused program takes f32 (or f16 or bf16 throughout), and u8 or i8 where "
                   "it dequantizes",
                   i, dtypeName(input));
    }
  }
  std::optional<DType> output_type;
  if (node.hasAttribute(std::string(kProgramQuantizeAttribute))) {
    const auto type = static_cast<DType>(node.intAttribute(std::string(kProgramQuantizeTypeAttribute), 0));
    if (type != DType::kU8 && type != DType::kI8) context.fail("quantize_type must be u8 or i8");
    output_type = type;
  }
  if (!node.hasAttribute(std::string(kProgramUpsampleAttribute))) {
    const std::vector<size_t> inputs = allInputs(context);
    context.output(0) = ValueType{output_type.value_or(dtype), broadcastInputs(context, inputs)};
    return;
  }
  if (!dequantize.empty()) context.fail("upsample and dequantize do not go together");
  // Upsampled inputs (core/elementwise_program.h): the others broadcast to
  // the output, and each upsampled one, scaled up, is exactly its shape.
  const std::vector<int64_t> factors = node.intsAttribute(std::string(kProgramUpsampleAttribute), {});
  if (factors.size() != 2 * context.inputCount()) {
    context.fail("upsample has {} factors for {} inputs; it takes two per input", factors.size(), context.inputCount());
  }
  std::vector<size_t> plain;
  for (size_t i = 0; i < context.inputCount(); ++i) {
    if (factors[2 * i] < 1 || factors[2 * i + 1] < 1) context.fail("input {}'s upsample factors must be positive", i);
    if (factors[2 * i] == 1 && factors[2 * i + 1] == 1) plain.push_back(i);
  }
  if (plain.empty()) context.fail("upsample leaves no input at the output's shape");
  const std::vector<Dim> out = broadcastInputs(context, plain);
  for (size_t i = 0; i < context.inputCount(); ++i) {
    if (factors[2 * i] == 1 && factors[2 * i + 1] == 1) continue;
    const auto& shape = context.inputType(i).shape;
    bool fits = shape && shape->size() == 4 && out.size() == 4;
    for (size_t d = 0; fits && d < 4; ++d) {
      const int64_t factor = d == 1 ? factors[2 * i] : d == 2 ? factors[2 * i + 1] : 1;
      fits = (*shape)[d].isKnown() && out[d].isKnown() && (*shape)[d].size * factor == out[d].size;
    }
    if (!fits) context.fail("input {} upsampled by {} x {} is not the output's shape {}", i, factors[2 * i], factors[2 * i + 1], dimsText(out));
  }
  context.output(0) = ValueType{output_type.value_or(dtype), out};
}

void add(OpRegistry& registry, const std::string& op, int64_t since, size_t min_inputs, size_t max_inputs,
         InferFunction infer, size_t max_outputs = 1) {
  registry.add(OpSchema{"", op, since, min_inputs, max_inputs, 1, max_outputs, std::move(infer)});
}

}  // namespace

void registerElementwiseOps(OpRegistry& registry) {
  for (const char* op : {"Relu", "Abs", "Neg", "Sign", "Identity"}) add(registry, op, 1, 1, 1, unary);
  add(registry, "BitwiseNot", 18, 1, 1, unary);
  for (const char* op : {"Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Erf", "Reciprocal", "Floor", "Ceil", "Round",
                         "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
                         "Softplus", "Softsign", "HardSigmoid", "LeakyRelu", "Elu", "Selu", "ThresholdedRelu",
                         "Shrink"}) {
    add(registry, op, 1, 1, 1, floatUnary);
  }
  add(registry, "Celu", 12, 1, 1, floatUnary);
  add(registry, "HardSwish", 14, 1, 1, floatUnary);
  add(registry, "Mish", 18, 1, 1, floatUnary);
  add(registry, "Gelu", 20, 1, 1, floatUnary);
  add(registry, "Swish", 24, 1, 1, floatUnary);
  add(registry, "Not", 1, 1, 1, logical);
  add(registry, "IsNaN", 9, 1, 1, predicate);
  add(registry, "IsInf", 10, 1, 1, predicate);
  add(registry, "Dropout", 1, 1, 3, dropout, 2);

  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu", "BitShift"}) {
    add(registry, op, 1, 2, 2, [op = std::string(op)](InferenceContext& c) {
      if (op == "Pow") {  // the exponent may have another type
        c.output(0) = ValueType{c.inputType(0).dtype, broadcastInputs(c, {0, 1})};
      } else {
        broadcasting(c);
      }
    });
  }
  for (const char* op : {"Max", "Min", "Sum", "Mean"}) add(registry, op, 1, 1, 64, [](auto& c) { broadcasting(c); });
  for (const char* op : {"Equal", "Less", "Greater"}) add(registry, op, 1, 2, 2, comparison);
  for (const char* op : {"LessOrEqual", "GreaterOrEqual"}) add(registry, op, 12, 2, 2, comparison);
  for (const char* op : {"And", "Or", "Xor"}) add(registry, op, 1, 2, 2, logical);
  for (const char* op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor"}) {
    add(registry, op, 18, 2, 2, [](InferenceContext& c) { broadcasting(c); });
  }
  add(registry, "Where", 9, 3, 3, where);
  add(registry, "Clip", 1, 1, 3, unary);
  add(registry, "Cast", 1, 1, 1, cast);
  add(registry, "CastLike", 15, 2, 2, castLike);
  registry.add(OpSchema{"kiln", "FusedElementwise", 1, 1, std::numeric_limits<size_t>::max(), 1, 1, fusedElementwise});
}

}  // namespace kiln

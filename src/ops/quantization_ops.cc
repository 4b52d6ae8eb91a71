// Quantization operators: QuantizeLinear, DequantizeLinear,
// DynamicQuantizeLinear, and the integer and quantized forms of MatMul and
// Conv (MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv).
//
// A scale (and its zero point, which has the scale's shape) is
//   per tensor  a scalar or a 1-element 1-D tensor,
//   per axis    a 1-D tensor of x.shape[axis] values (opset 13 on),
//   blocked     block_size > 0 (opset 21 on): x's rank, x's dims except
//               ceil(x.shape[axis] / block_size) along the axis.
// The quantized type is the zero point's, else the output_dtype attribute
// (opset 21 on), else u8. The integer and quantized MatMul and Conv forms
// take their output shapes from the plain operator's schema
// (delegated_inference.h). kiln.QLinearAdd, kiln.QLinearMul and
// kiln.QLinearConcat are what the QDQ fusion makes of an Add, a Mul and a
// Concat between quantizations.
#include <fmt/ranges.h>

#include <variant>
#include <vector>

#include "ops/delegated_inference.h"
#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

bool isQuantizedType(DType dtype) {
  switch (dtype) {
    case DType::kU8:
    case DType::kI8:
    case DType::kU16:
    case DType::kI16:
    case DType::kU4:
    case DType::kI4:
    case DType::kU2:
    case DType::kI2:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF4E2M1:
      return true;
    default:
      return false;
  }
}

bool isScaleType(DType dtype) { return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16; }

bool isSingle(const std::vector<Dim>& dims) { return dims.empty() || (dims.size() == 1 && dims[0] == Dim::known(1)); }

// Fails unless input `index` (a scale or zero point) has one of the three
// shapes the header describes.
void checkParameterShape(const InferenceContext& context, size_t index) {
  const std::vector<Dim>* x = knownShape(context, 0);
  const std::vector<Dim>* s = knownShape(context, index);
  if (!x || !s || isSingle(*s)) return;
  const int64_t block_size = context.node().intAttribute("block_size", 0);
  if (block_size < 0) context.fail("block_size must not be negative, found {}", block_size);
  const size_t axis = normalizeAxis(context, context.node().intAttribute("axis", 1), x->size());
  if (block_size == 0) {
    if (s->size() != 1 || ((*s)[0].isKnown() && (*x)[axis].isKnown() && (*s)[0] != (*x)[axis])) {
      context.fail("input {} {} must be a scalar, [1] or [{}] (one value per element of axis {} of {})", index,
                   dimsText(*s), (*x)[axis].isKnown() ? std::to_string((*x)[axis].size) : "?", axis, dimsText(*x));
    }
    return;
  }
  bool fits = s->size() == x->size();
  for (size_t i = 0; fits && i < x->size(); ++i) {
    const Dim& in = (*x)[i];
    const Dim& got = (*s)[i];
    if (!in.isKnown() || !got.isKnown()) continue;
    fits = got.size == (i == axis ? (in.size + block_size - 1) / block_size : in.size);
  }
  if (!fits) {
    context.fail("blocked quantization (block_size {}, axis {}): input {} {} must have the dims of {} with "
                 "ceil(size / block_size) along the axis",
                 block_size, axis, index, dimsText(*s), dimsText(*x));
  }
}

// The scale (input `scale`) and the optional zero point after it: each of a
// valid shape, and the same shape unless both are single values.
void checkQuantizationParameters(const InferenceContext& context, size_t scale) {
  checkParameterShape(context, scale);
  checkParameterShape(context, scale + 1);
  const std::vector<Dim>* s = knownShape(context, scale);
  const std::vector<Dim>* zero = knownShape(context, scale + 1);
  if (s && zero && *s != *zero && !(isSingle(*s) && isSingle(*zero))) {
    context.fail("the zero point {} must have the scale's shape {}", dimsText(*zero), dimsText(*s));
  }
}

void quantizeLinear(InferenceContext& context) {
  const DType x = context.inputType(0).dtype;
  if (!isScaleType(x) && x != DType::kI32) {
    context.fail("x must be f32, f16, bf16 or i32, found {}", dtypeName(x));
  }
  if (!isScaleType(context.inputType(1).dtype)) {
    context.fail("y_scale must be f32, f16 or bf16, found {}", dtypeName(context.inputType(1).dtype));
  }
  DType out = DType::kU8;
  const int64_t output_dtype = context.node().intAttribute("output_dtype", 0);
  if (output_dtype != 0) {
    if (output_dtype < 0 || output_dtype > 255 || !isValidDType(static_cast<uint8_t>(output_dtype))) {
      context.fail("output_dtype {} is not a type kiln supports", output_dtype);
    }
    out = static_cast<DType>(output_dtype);
  }
  if (context.hasInput(2)) {
    const DType zero = context.inputType(2).dtype;
    if (output_dtype != 0 && zero != out) {
      context.fail("output_dtype is {} but the zero point is {}", dtypeName(out), dtypeName(zero));
    }
    out = zero;
  }
  if (!isQuantizedType(out)) {
    context.fail("no quantized type {} (kiln quantizes to u8, i8, u16, i16, u4, i4, u2, i2, f8e4m3, f8e5m2, f4e2m1)", dtypeName(out));
  }
  checkQuantizationParameters(context, 1);
  context.output(0) = ValueType{out, context.inputType(0).shape};
}

void dequantizeLinear(InferenceContext& context) {
  const DType x = context.inputType(0).dtype;
  if (!isQuantizedType(x) && x != DType::kI32) {
    context.fail("x must be u8, i8, u16, i16, i32, u4, i4, u2, i2, f8e4m3, f8e5m2 or f4e2m1, found {}", dtypeName(x));
  }
  const DType scale = context.inputType(1).dtype;
  if (!isScaleType(scale)) context.fail("x_scale must be f32, f16 or bf16, found {}", dtypeName(scale));
  if (context.hasInput(2) && context.inputType(2).dtype != x) {
    context.fail("the zero point is {} but x is {}: they must match", dtypeName(context.inputType(2).dtype),
                 dtypeName(x));
  }
  DType out = scale;
  const int64_t output_dtype = context.node().intAttribute("output_dtype", 0);
  if (output_dtype != 0) {
    if (output_dtype < 0 || output_dtype > 255 || !isScaleType(static_cast<DType>(output_dtype))) {
      context.fail("output_dtype {} is not f32, f16 or bf16", output_dtype);
    }
    out = static_cast<DType>(output_dtype);
  }
  checkQuantizationParameters(context, 1);
  context.output(0) = ValueType{out, context.inputType(0).shape};
}

// y (u8, x's shape), y_scale (f32 scalar), y_zero_point (u8 scalar).
void dynamicQuantizeLinear(InferenceContext& context) {
  if (context.inputType(0).dtype != DType::kF32) {
    context.fail("x must be f32, found {}", dtypeName(context.inputType(0).dtype));
  }
  context.output(0) = ValueType{DType::kU8, context.inputType(0).shape};
  context.output(1) = ValueType{DType::kF32, std::vector<Dim>{}};
  context.output(2) = ValueType{DType::kU8, std::vector<Dim>{}};
}

void expectInteger8(const InferenceContext& context, size_t index, const char* name) {
  const DType dtype = context.inputType(index).dtype;
  if (dtype != DType::kU8 && dtype != DType::kI8) context.fail("{} must be u8 or i8, found {}", name, dtypeName(dtype));
}

// The zero point (input `index`), when present, has the type of `of`.
void expectZeroPointType(const InferenceContext& context, size_t index, size_t of) {
  if (context.hasInput(index) && context.inputType(index).dtype != context.inputType(of).dtype) {
    context.fail("the zero point (input {}) is {} but input {} is {}: they must match", index,
                 dtypeName(context.inputType(index).dtype), of, dtypeName(context.inputType(of).dtype));
  }
}

// MatMulInteger(A, B, a_zero_point?, b_zero_point?) and ConvInteger(x, w,
// x_zero_point?, w_zero_point?): i32 results.
void integerForm(InferenceContext& context, const std::string& op) {
  expectInteger8(context, 0, "input 0");
  expectInteger8(context, 1, "input 1");
  expectZeroPointType(context, 2, 0);
  expectZeroPointType(context, 3, 1);
  context.output(0) = ValueType{DType::kI32, delegatedShape(context, op, {0, 1})};
}

// QLinearMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp) and
// QLinearConv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B?).
void quantizedForm(InferenceContext& context, const std::string& op) {
  expectInteger8(context, 0, "input 0");
  expectInteger8(context, 3, "input 3");
  expectInteger8(context, 7, "the output zero point (input 7)");
  expectZeroPointType(context, 2, 0);
  expectZeroPointType(context, 5, 3);
  for (size_t scale : {1u, 4u, 6u}) {
    if (!isScaleType(context.inputType(scale).dtype)) {
      context.fail("input {} (a scale) must be f32, f16 or bf16, found {}", scale,
                   dtypeName(context.inputType(scale).dtype));
    }
  }
  if (context.hasInput(8) && context.inputType(8).dtype != DType::kI32) {
    context.fail("the bias must be i32, found {}", dtypeName(context.inputType(8).dtype));
  }
  const std::vector<size_t> inputs = op == "Conv" ? std::vector<size_t>{0, 3, 8} : std::vector<size_t>{0, 3};
  context.output(0) = ValueType{context.inputType(7).dtype, delegatedShape(context, op, inputs)};
}

void add(OpRegistry& registry, const std::string& op, int64_t since, size_t min_inputs, size_t max_inputs,
         InferFunction infer, size_t outputs = 1) {
  registry.add(OpSchema{"", op, since, min_inputs, max_inputs, outputs, outputs, std::move(infer)});
}

}  // namespace

void registerQuantizationOps(OpRegistry& registry) {
  // 10: per tensor; 13: axis; 19: saturate and float8; 21: block_size,
  // output_dtype; 23: precision (QuantizeLinear) and output_dtype
  // (DequantizeLinear). One inference reads whichever attributes are set.
  for (int64_t since : {10, 13, 19, 21, 23}) {
    add(registry, "QuantizeLinear", since, 2, 3, quantizeLinear);
    add(registry, "DequantizeLinear", since, 2, 3, dequantizeLinear);
  }
  add(registry, "DynamicQuantizeLinear", 11, 1, 1, dynamicQuantizeLinear, 3);
  add(registry, "MatMulInteger", 10, 2, 4, [](InferenceContext& c) { integerForm(c, "MatMul"); });
  add(registry, "ConvInteger", 10, 2, 4, [](InferenceContext& c) { integerForm(c, "Conv"); });
  // kiln.MatMulIntegerToFloat(A, B, a_zero_point?, b_zero_point?, scale[,
  // addend]): MatMulInteger's sums as f32 times scale (one value, or one per
  // column), plus a bias [N] or a residual of the product's shape: what
  // passes/integer_matmul_fusion.h makes of MatMulInteger -> Cast -> Mul -> Add.
  registry.add(OpSchema{"kiln", "MatMulIntegerToFloat", 1, 5, 6, 1, 1, [](InferenceContext& c) {
                          integerForm(c, "MatMul");
                          if (c.inputType(4).dtype != DType::kF32) {
                            c.fail("the scale (input 4) must be f32, found {}", dtypeName(c.inputType(4).dtype));
                          }
                          c.output(0).dtype = DType::kF32;
                        }});
  // kiln.DynamicInt8MatMul(x f32 [..., k], w i8 [k, n], w_scale f32 [n][,
  // bias f32 [n]]): x @ (w * w_scale) + bias computed in int8, x quantized
  // per row in groups of 32 as it runs; what passes/activation_quantization.h
  // makes of a MatMul over int8 weights (compile --quantize-activations).
  registry.add(OpSchema{"kiln", "DynamicInt8MatMul", 1, 3, 4, 1, 1, [](InferenceContext& c) {
                          if (c.inputType(0).dtype != DType::kF32) {
                            c.fail("input 0 must be f32, found {}", dtypeName(c.inputType(0).dtype));
                          }
                          if (c.inputType(1).dtype != DType::kI8) {
                            c.fail("the weights (input 1) must be i8, found {}", dtypeName(c.inputType(1).dtype));
                          }
                          c.output(0) = ValueType{DType::kF32, delegatedShape(c, "MatMul", {0, 1})};
                        }});
  add(registry, "QLinearMatMul", 10, 8, 8, [](InferenceContext& c) { quantizedForm(c, "MatMul"); });
  add(registry, "QLinearMatMul", 21, 8, 8, [](InferenceContext& c) { quantizedForm(c, "MatMul"); });  // f16 scales
  // kiln.QLinearMatMul(QLinearMatMul's 8 inputs, bias?): an optional i32
  // bias [n] at the scale a_scale * b_scale, added to the sums before they
  // are requantized, as QLinearConv's; what passes/qdq_fusion.h makes of
  // Q(Gemm(DQ(a), DQ(w), bias)).
  registry.add(OpSchema{"kiln", "QLinearMatMul", 1, 8, 9, 1, 1,
                        [](InferenceContext& c) { quantizedForm(c, "MatMul"); }});
  add(registry, "QLinearConv", 10, 8, 9, [](InferenceContext& c) { quantizedForm(c, "Conv"); });
  // kiln.QLinearAdd and kiln.QLinearMul(a, a_scale, a_zero_point, b,
  // b_scale, b_zero_point, y_scale, y_zero_point): Add and Mul on quantized
  // tensors (onnxruntime's com.microsoft QLinearAdd, QLinearMul); what
  // passes/qdq_fusion.h makes of Q(Add(DQ(a), DQ(b))) and Q(Mul(...)). a, b
  // and the output have one 8-bit type.
  for (const char* op : {"Add", "Mul"}) {
    registry.add(OpSchema{"kiln", std::string("QLinear") + op, 1, 8, 8, 1, 1, [op](InferenceContext& c) {
                            expectInteger8(c, 0, "input 0");
                            for (size_t i : {3u, 7u}) {
                              if (c.inputType(i).dtype != c.inputType(0).dtype) {
                                c.fail("input {} is {} but input 0 is {}: they must match", i,
                                       dtypeName(c.inputType(i).dtype), dtypeName(c.inputType(0).dtype));
                              }
                            }
                            c.output(0) = ValueType{c.inputType(0).dtype, delegatedShape(c, op, {0, 3})};
                          }});
  }
  // kiln.Lookup8(x, table): y = table[x] for 8-bit x and a table of 256
  // values of y's type (u8 or i8); what passes/byte_tables.h makes of a
  // chain of 8-bit table steps.
  registry.add(OpSchema{"kiln", "Lookup8", 1, 2, 2, 1, 1, [](InferenceContext& c) {
                          expectInteger8(c, 0, "x (input 0)");
                          expectInteger8(c, 1, "the table (input 1)");
                          c.output(0) = ValueType{c.inputType(1).dtype, c.inputType(0).shape};
                        }});
  // kiln.QLinearConcat(x_1, ..., x_n; axis, scales, zero_points): Concat of
  // 8-bit tensors of one type, each requantized from its own scale and zero
  // point to the output's (the attributes list the inputs', then the
  // output's); what passes/qdq_fusion.h makes of Q(Concat(DQ(x_1), ...)) when
  // the parameters differ.
  registry.add(OpSchema{"kiln", "QLinearConcat", 1, 1, 1u << 16, 1, 1, [](InferenceContext& c) {
                          const size_t n = c.inputCount();
                          std::vector<size_t> inputs;
                          for (size_t i = 0; i < n; ++i) {
                            expectInteger8(c, i, "every input");
                            if (c.inputType(i).dtype != c.inputType(0).dtype) {
                              c.fail("input {} is {} but input 0 is {}: they must match", i,
                                     dtypeName(c.inputType(i).dtype), dtypeName(c.inputType(0).dtype));
                            }
                            inputs.push_back(i);
                          }
                          const auto scales = c.node().attributes.find("scales");
                          const auto* scale_values = scales == c.node().attributes.end()
                                                         ? nullptr
                                                         : std::get_if<std::vector<float>>(&scales->second);
                          const std::vector<int64_t> zeros = c.node().intsAttribute("zero_points", {});
                          if (scale_values == nullptr || scale_values->size() != n + 1 || zeros.size() != n + 1) {
                            c.fail("scales and zero_points take {} values each (the inputs', then the output's)",
                                   n + 1);
                          }
                          c.output(0) = ValueType{c.inputType(0).dtype, delegatedShape(c, "Concat", inputs)};
                        }});
}

}  // namespace kiln

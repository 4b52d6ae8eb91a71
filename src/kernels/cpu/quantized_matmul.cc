#include "kernels/cpu/quantized_matmul.h"

namespace kiln {
namespace {

constexpr const char* kKernel = "QLinearMatMul";

dnnl::memory::data_type integerType(DType dtype) {
  return dtype == DType::kU8 ? dnnl::memory::data_type::u8 : dnnl::memory::data_type::s8;
}

}  // namespace

std::unique_ptr<QuantizedMatMul> prepareQuantizedMatMul(int64_t rows, int64_t k, int64_t n, DType a_type, DType y_type,
                                                        const int8_t* b, const std::vector<float>& scales,
                                                        int32_t a_zero, int32_t y_zero) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const dnnl::engine& engine = onednn::cpuEngine();
  const dnnl::memory::desc src({rows, k}, integerType(a_type), tag::ab);
  const dnnl::memory::desc weights_plain({k, n}, dt::s8, tag::ab);
  const dnnl::memory::desc weights_any({k, n}, dt::s8, tag::any);
  const dnnl::memory::desc dst({rows, n}, integerType(y_type), tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_output_scales(scales.size() == 1 ? 0 : 1 << 1, scales);
  attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  attr.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
  auto matmul = std::make_unique<QuantizedMatMul>();
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights_any, dst), attr, engine);
  } catch (const dnnl::error&) {
    return nullptr;
  }
  matmul->primitive = dnnl::matmul(pd);
  matmul->packed_b = onednn::reorderConstant(weights_plain, reinterpret_cast<const std::byte*>(b), pd.weights_desc());
  matmul->zeros[0] = a_zero;
  matmul->zeros[1] = y_zero;
  const dnnl::memory::desc zero_point({1}, dt::s32, tag::x);
  matmul->src_zero = dnnl::memory(zero_point, engine, &matmul->zeros[0]);
  matmul->dst_zero = dnnl::memory(zero_point, engine, &matmul->zeros[1]);
  matmul->slots.create(engine, pd.scratchpad_desc());
  for (size_t i = 0; i < onednn::kExecutionSlots; ++i) {
    onednn::ExecutionSlot& slot = matmul->slots[i];
    slot.src = dnnl::memory(pd.src_desc(), engine, DNNL_MEMORY_NONE);
    slot.dst = dnnl::memory(pd.dst_desc(), engine, DNNL_MEMORY_NONE);
  }
  return matmul;
}

void runQuantizedMatMul(const QuantizedMatMul& matmul, const std::byte* a, std::byte* y) {
  onednn::ExecutionSlot& slot = matmul.slots.claim();
  onednn::setHandle(kKernel, slot.src, const_cast<std::byte*>(a));
  onednn::setHandle(kKernel, slot.dst, y);
  dnnl_exec_arg_t args[6] = {{DNNL_ARG_SRC, slot.src.get()},
                             {DNNL_ARG_WEIGHTS, matmul.packed_b.get()},
                             {DNNL_ARG_DST, slot.dst.get()},
                             {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, matmul.src_zero.get()},
                             {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, matmul.dst_zero.get()}};
  onednn::execute(kKernel, matmul.primitive, matmul.slots, slot, args, 5);
}

}  // namespace kiln

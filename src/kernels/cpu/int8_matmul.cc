#include "kernels/cpu/int8_matmul.h"

namespace kiln {
namespace {

constexpr const char* kKernel = "MatMulInteger";

}  // namespace

std::unique_ptr<Int8MatMul> prepareInt8MatMul(int64_t m, int64_t n, int64_t k, DType a_dtype, const int8_t* b,
                                              int8_t b_zero) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const dnnl::engine& engine = onednn::cpuEngine();
  const dnnl::memory::desc src({m, k}, a_dtype == DType::kU8 ? dt::u8 : dt::s8, tag::ab);
  const dnnl::memory::desc weights_plain({k, n}, dt::s8, tag::ab);
  const dnnl::memory::desc weights_any({k, n}, dt::s8, tag::any);
  const dnnl::memory::desc dst({m, n}, dt::s32, tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  if (b_zero != 0) attr.set_zero_points(DNNL_ARG_WEIGHTS, 0, {b_zero});
  auto matmul = std::make_unique<Int8MatMul>();
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights_any, dst), attr, engine);
  } catch (const dnnl::error&) {
    return nullptr;
  }
  matmul->primitive = dnnl::matmul(pd);
  matmul->packed_b = onednn::reorderConstant(weights_plain, reinterpret_cast<const std::byte*>(b), pd.weights_desc());
  matmul->slots.create(engine, pd.scratchpad_desc());
  const dnnl::memory::desc zero_point({1}, dt::s32, tag::x);
  for (size_t i = 0; i < onednn::kExecutionSlots; ++i) {
    onednn::ExecutionSlot& slot = matmul->slots[i];
    slot.src = dnnl::memory(pd.src_desc(), engine, DNNL_MEMORY_NONE);
    slot.dst = dnnl::memory(pd.dst_desc(), engine, DNNL_MEMORY_NONE);
    slot.zero_point = dnnl::memory(zero_point, engine, DNNL_MEMORY_NONE);
  }
  return matmul;
}

void runInt8MatMul(const Int8MatMul& matmul, const std::byte* a, int32_t a_zero, int32_t* y) {
  onednn::ExecutionSlot& slot = matmul.slots.claim();
  onednn::setHandle(kKernel, slot.src, const_cast<std::byte*>(a));
  onednn::setHandle(kKernel, slot.dst, y);
  onednn::setHandle(kKernel, slot.zero_point, &a_zero);
  dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, slot.src.get()},
                             {DNNL_ARG_WEIGHTS, matmul.packed_b.get()},
                             {DNNL_ARG_DST, slot.dst.get()},
                             {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, slot.zero_point.get()}};
  onednn::execute(kKernel, matmul.primitive, matmul.slots, slot, args, 4);
}

}  // namespace kiln

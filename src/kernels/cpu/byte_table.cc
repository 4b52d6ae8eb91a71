// kiln.Lookup8(x, table): y[i] = table[x[i]] for 8-bit x (u8 or i8, read as
// its bytes) and a constant table of 256 values of y's type (u8 or i8). What
// passes/byte_tables.h makes of a chain of 8-bit table steps; run by
// vec::lookup8 (64 bytes per two vpermi2b with AVX-512 VBMI).
#include <fmt/format.h>

#include <array>
#include <cstring>
#include <memory>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr const char* kKernel = "kiln.Lookup8";

struct ByteTableState final : KernelState {
  std::array<uint8_t, 256> table{};
  int64_t elements = 0;
};

std::unique_ptr<KernelState> prepareLookup8(const KernelSetup& setup) {
  if (setup.inputs.size() != 2 || setup.outputs.size() != 1) {
    throw UsageError(fmt::format("{}: expects 2 inputs (x, table) and 1 output", kKernel));
  }
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& table = setup.inputs[1];
  const TensorInfo& y = setup.outputs[0];
  if (!isInteger8(x.dtype) || !x.isStatic()) {
    throw UsageError(fmt::format("{}: x must be u8 or i8 of static shape, found {}{}", kKernel, dtypeName(x.dtype),
                                 x.shapeString()));
  }
  if (!isInteger8(table.dtype) || table.numElements() != 256) {
    throw UsageError(fmt::format("{}: the table must hold 256 u8 or i8 values, found {}{}", kKernel,
                                 dtypeName(table.dtype), table.shapeString()));
  }
  const std::byte* values = setup.constants.size() > 1 ? setup.constants[1] : nullptr;
  if (values == nullptr) throw UsageError(fmt::format("{}: the table (input 1) must be a constant", kKernel));
  if (y != TensorInfo{table.dtype, x.shape}) {
    throw UsageError(fmt::format("{}: the output is {}{} but x and the table give {}{}", kKernel, dtypeName(y.dtype),
                                 y.shapeString(), dtypeName(table.dtype), x.shapeString()));
  }
  auto state = std::make_unique<ByteTableState>();
  std::memcpy(state->table.data(), values, state->table.size());
  state->elements = static_cast<int64_t>(x.numElements());
  return state;
}

void runLookup8(const KernelCall& call) {
  const auto& state = static_cast<const ByteTableState&>(*call.state);
  const auto* x = call.inputs[0].as<const uint8_t>();
  auto* y = call.outputs[0].as<uint8_t>();
  const vec::VectorKernels& kernels = vec::vectorKernels();
  parallelForElements(state.elements, [&](int64_t begin, int64_t end) {
    kernels.lookup8(x + begin, 0, y + begin, 0, 1, end - begin, state.table.data());
  });
}

}  // namespace

void registerByteTableKernels(KernelRegistry& registry) {
  registry.add(KernelDef{kKernel, &prepareLookup8, &runLookup8});
}

}  // namespace kiln

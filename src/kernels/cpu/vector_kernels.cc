// Chooses the VectorKernels table for this CPU (see vector_kernels.h).
#include "kernels/cpu/vector_kernels.h"

#include <cstdlib>

namespace kiln::vec {

std::string_view isaName(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return "generic";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

namespace {

// Whether this CPU (and OS: the checks include the saved register state) can
// run `isa`'s table.
bool cpuRuns(Isa isa) {
  __builtin_cpu_init();  // needed when called before libgcc's own constructor
  switch (isa) {
    case Isa::kGeneric:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
}

const VectorKernels& tableOf(Isa isa) {
  switch (isa) {
    case Isa::kAvx2:
      return detail::avx2Kernels();
    case Isa::kAvx512:
      return detail::avx512Kernels();
    case Isa::kGeneric:
      break;
  }
  return detail::genericKernels();
}

const VectorKernels& chooseKernels() {
  Isa cap = Isa::kAvx512;
  if (const char* requested = std::getenv("KILN_CPU_ISA")) {
    for (Isa isa : kAllIsas) {
      if (isaName(isa) == requested) cap = isa;
    }
  }
  for (auto it = kAllIsas.rbegin(); it != kAllIsas.rend(); ++it) {
    if (*it <= cap && cpuRuns(*it)) return tableOf(*it);
  }
  return detail::genericKernels();
}

}  // namespace

std::optional<Unary> unaryForActivation(FusedActivation activation) {
  switch (activation) {
    case FusedActivation::kRelu: return Unary::kRelu;
    case FusedActivation::kLeakyRelu: return Unary::kLeakyRelu;
    case FusedActivation::kSigmoid: return Unary::kSigmoid;
    case FusedActivation::kTanh: return Unary::kTanh;
    case FusedActivation::kClip: return Unary::kClip;
    case FusedActivation::kGelu: return Unary::kGelu;
    case FusedActivation::kGeluTanh: return Unary::kGeluTanh;
    case FusedActivation::kHardSwish: return Unary::kHardSwish;
    case FusedActivation::kNone:
    case FusedActivation::kSwish:
    case FusedActivation::kLinear: return std::nullopt;
  }
  return std::nullopt;
}

const VectorKernels* vectorKernelsFor(Isa isa) { return cpuRuns(isa) ? &tableOf(isa) : nullptr; }

const VectorKernels& vectorKernels() {
  static const VectorKernels& chosen = chooseKernels();
  return chosen;
}

}  // namespace kiln::vec

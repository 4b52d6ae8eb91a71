#include "core/elementwise_program.h"

#include "core/param_map.h"
#include "kiln/error.h"

#include <fmt/format.h>

#include <cstdint>

namespace kiln {

std::string joinElementwiseOps(const std::vector<ElementwiseOp>& ops) {
  std::string text;
  for (ElementwiseOp op : ops) {
    if (!text.empty()) text += ',';
    text += elementwiseOpName(op);
  }
  return text;
}

std::optional<std::vector<ElementwiseOp>> parseElementwiseOps(std::string_view text) {
  std::vector<ElementwiseOp> ops;
  if (text.empty()) return ops;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    const std::optional<ElementwiseOp> op = parseElementwiseOp(text.substr(start, comma - start));
    if (!op) return std::nullopt;
    ops.push_back(*op);
    if (comma == std::string_view::npos) return ops;
    start = comma + 1;
  }
}

ElementwiseProgram readElementwiseProgram(const ParamMap& params, size_t input_count) {
  constexpr std::string_view kOp = "kiln.FusedElementwise";
  ElementwiseProgram program;
  program.input_count = input_count;
  const std::string ops = params.getString(std::string(kProgramOpsAttribute), "");
  const auto parsed = parseElementwiseOps(ops);
  if (!parsed) throw UsageError(fmt::format("{}: ops '{}' names an op that is not in the list", kOp, ops));
  program.ops = *parsed;
  program.operands = params.getInts(std::string(kProgramOperandsAttribute), {});
  auto floats = [&](std::string_view key) {
    const std::vector<double> values = params.getFloats(std::string(key), {});
    return std::vector<float>(values.begin(), values.end());
  };
  program.alpha = floats(kProgramAlphaAttribute);
  program.beta = floats(kProgramBetaAttribute);
  program.immediates = floats(kProgramImmediatesAttribute);
  if (const std::string problem = checkElementwiseProgram(program); !problem.empty()) {
    throw UsageError(fmt::format("{}: {}", kOp, problem));
  }
  return program;
}

std::string checkElementwiseProgram(const ElementwiseProgram& program) {
  const size_t count = program.ops.size();
  if (count == 0) return "the program has no instructions";
  if (program.operands.size() != 2 * count) {
    return fmt::format("{} instructions need {} operands, found {}", count, 2 * count, program.operands.size());
  }
  if (program.alpha.size() != count || program.beta.size() != count) {
    return fmt::format("{} instructions need {} alpha and beta values, found {} and {}", count, count,
                       program.alpha.size(), program.beta.size());
  }
  for (size_t i = 0; i < count; ++i) {
    const size_t arity = isBinary(program.ops[i]) ? 2 : 1;
    for (size_t k = 0; k < 2; ++k) {
      const int64_t slot = program.operands[2 * i + k];
      const bool wanted = k < arity;
      if (!wanted && slot != kNoOperand) {
        return fmt::format("instruction {} ({}) takes one operand but has a second, slot {}", i,
                           elementwiseOpName(program.ops[i]), slot);
      }
      if (wanted && (slot < 0 || slot >= program.resultSlot(i))) {
        return fmt::format("instruction {} ({}) reads slot {}, which is not an input, an immediate or an earlier "
                           "result (slots 0 to {} are defined there)",
                           i, elementwiseOpName(program.ops[i]), slot, program.resultSlot(i) - 1);
      }
    }
  }
  return "";
}

RegisterAssignment assignRegisters(const ElementwiseProgram& program) {
  const size_t count = program.ops.size();
  const int64_t first_result = program.resultSlot(0);
  // The last instruction that reads each result (kUnread: none does).
  constexpr size_t kUnread = SIZE_MAX;
  std::vector<size_t> last_read(count, kUnread);
  for (size_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < 2; ++k) {
      const int64_t slot = program.operands[2 * i + k];
      if (slot >= first_result) last_read[static_cast<size_t>(slot - first_result)] = i;
    }
  }
  RegisterAssignment assignment;
  assignment.result_register.assign(count, kOutputRegister);
  std::vector<uint32_t> free_registers;  // a stack: the most recently freed is reused first
  for (size_t i = 0; i < count; ++i) {
    // Operands read for the last time give their registers back before the
    // result takes one, so that the op may run in place.
    for (size_t k = 0; k < 2; ++k) {
      const int64_t slot = program.operands[2 * i + k];
      if (slot < first_result || (k == 1 && slot == program.operands[2 * i])) continue;
      const auto operand = static_cast<size_t>(slot - first_result);
      if (last_read[operand] == i) free_registers.push_back(assignment.result_register[operand]);
    }
    if (i + 1 == count) break;  // the last result goes to the output
    if (free_registers.empty()) {
      assignment.result_register[i] = assignment.count++;
    } else {
      assignment.result_register[i] = free_registers.back();
      free_registers.pop_back();
    }
    if (last_read[i] == kUnread) free_registers.push_back(assignment.result_register[i]);  // dead at once
  }
  return assignment;
}

}  // namespace kiln

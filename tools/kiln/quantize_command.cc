// `kiln quantize`: post-training quantization, which lives in the Python
// package (python/kiln/quantize.py: calibration runs the model through kiln
// and writes an ONNX model with the onnx package). This command runs
// `python -m kiln.quantize` with its arguments, so that the tool has one
// entry point for it.
//
// The interpreter: KILN_PYTHON when set; else the python3 beside this
// executable (a virtual environment's bin, where `pip install .` puts
// `kiln`); else python3 on the PATH. It must import kiln, onnx and numpy.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tools/kiln/commands.h"

namespace kiln::cli {
namespace {

std::string pythonInterpreter() {
  if (const char* chosen = std::getenv("KILN_PYTHON"); chosen != nullptr && *chosen != '\0') return chosen;
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::filesystem::path beside = self.parent_path() / "python3";
    if (std::filesystem::exists(beside, error)) return beside.string();
  }
  return "python3";
}

}  // namespace

Command addQuantizeCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Quantize an f32 ONNX model to int8 from calibration data (python -m kiln.quantize; "
      "`kiln quantize -- --help` for its options; docs/quantization.md)");
  cmd->prefix_command();  // everything after `quantize` goes to the Python tool
  return [cmd] {
    std::vector<std::string> args = {pythonInterpreter(), "-m", "kiln.quantize"};
    for (const std::string& extra : cmd->remaining()) args.push_back(extra);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    std::fflush(stdout);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "kiln: error: cannot run %s for `kiln quantize` (%s); set KILN_PYTHON to a Python that "
                 "imports kiln\n", args[0].c_str(), std::strerror(errno));
    return 1;
  };
}

}  // namespace kiln::cli

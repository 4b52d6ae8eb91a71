// Sub-commands of the `kiln` command line. Each registers its options on the
// app and returns the function that runs it; the function returns the
// process exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace kiln::cli {

using Command = std::function<int()>;

Command addDumpCommand(CLI::App& app);
Command addCompileCommand(CLI::App& app);
Command addRunCommand(CLI::App& app);
Command addBenchCommand(CLI::App& app);
Command addDevicesCommand(CLI::App& app);
Command addQuantizeCommand(CLI::App& app);
#ifdef KILN_HAS_SERVER
Command addServeCommand(CLI::App& app);
#endif

}  // namespace kiln::cli

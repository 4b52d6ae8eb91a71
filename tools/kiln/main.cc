// The `kiln` command line. Exit codes: 0 success, 1 the input was refused
// (malformed package, I/O error), 2 bad command-line usage.
#include <cstdio>
#include <exception>
#include <map>
#include <new>

#include "kiln/error.h"
#include "kiln/version.h"
#include "tools/kiln/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: compile neural networks ahead of time and run them"};
  app.set_version_flag("--version", std::string(kiln::kProducer));
  app.require_subcommand(1);
  std::map<std::string, kiln::cli::Command> commands;
  commands["bench"] = kiln::cli::addBenchCommand(app);
  commands["compile"] = kiln::cli::addCompileCommand(app);
  commands["devices"] = kiln::cli::addDevicesCommand(app);
  commands["dump"] = kiln::cli::addDumpCommand(app);
  commands["quantize"] = kiln::cli::addQuantizeCommand(app);
  commands["run"] = kiln::cli::addRunCommand(app);
#ifdef KILN_HAS_SERVER
  commands["serve"] = kiln::cli::addServeCommand(app);
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    for (CLI::App* sub : app.get_subcommands()) return commands.at(sub->get_name())();
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // A size the input declares (a shape, a decompressed length) that this
    // machine cannot hold: refused like any other bad input, not an abort.
    std::fprintf(stderr, "kiln: error: out of memory: the input asks for more memory than this machine has\n");
    return 1;
  } catch (const std::exception& e) {
    // Anything else a library threw (a number that does not parse, ...):
    // still an error message and exit status 1, never an abort.
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  }
  return 2;
}

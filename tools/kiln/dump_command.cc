// `kiln dump [options] FILE...`: shows what a package holds. Several files
// form one model, as in the reader.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "format/executable_spec.h"
#include "kiln/format.h"
#include "kiln/log.h"
#include "tools/kiln/commands.h"

namespace kiln::cli {

Command addDumpCommand(CLI::App& app) {
  struct Args {
    std::vector<std::string> files;
    DumpOptions dump;
    bool all = false;
    bool json = false;
    bool verbose = false;
    bool verify = false;
    bool verify_format = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("dump", "Show the blobs, metadata and anchors of a package");
  cmd->add_option("files", args->files, "Package file(s); several files form one model")->required()->check(
      CLI::ExistingFile);
  cmd->add_flag("--all", args->all, "Display everything listed below");
  cmd->add_flag("-m,--metadata", args->dump.metadata, "Display Metadata blobs: target, options, program flow");
  cmd->add_flag("-a,--anchors", args->dump.anchors,
                "Display anchors: inputs and outputs, each user-provided or package-provided");
  cmd->add_flag("-u,--user-anchors", args->dump.user_anchors,
                "Display only the anchors the user must provide (not backed by TensorData/FeedData)");
  cmd->add_flag("-e,--execs", args->dump.executables, "Display Executable blobs");
  cmd->add_flag("-t,--tensors", args->dump.tensors, "Display TensorData blobs");
  cmd->add_flag("-f,--feeds", args->dump.feeds, "Display FeedData blobs");
  cmd->add_flag("-o,--opaques", args->dump.opaques, "Display Opaque blobs");
  cmd->add_flag("-c,--color", args->dump.color, "Use colour formatting");
  cmd->add_flag("-v,--verbose", args->verbose, "Log what the reader does (debug level)");
  cmd->add_flag("--json", args->json, "Print one JSON document instead of text");
  cmd->add_flag("--verify", args->verify,
                "Verify every payload checksum, and each model's executable as loading it does (structure, "
                "what its steps write, its anchors), before printing");
  cmd->add_flag("--verify-format", args->verify_format,
                "Verify the file format alone (every payload checksum, compressed executables decompress): for "
                "packages whose executables are not kiln's own");

  return [args]() {
    if (args->verbose) setLogLevel(LogLevel::kDebug);
    DumpOptions options = args->dump;
    if (args->all) {
      const bool color = options.color;
      options = DumpOptions::all();
      options.color = color;
    }
    std::vector<std::filesystem::path> paths(args->files.begin(), args->files.end());
    ReaderOptions reader_options;
    if (args->verify || args->verify_format) reader_options.checksums = ChecksumPolicy::kEager;
    const PackageReader reader(paths, reader_options);
    if (args->verify || args->verify_format) {
      for (const ExecutableBlob* executable : reader.executables()) {
        if (executable->compressed()) (void)executable->read();
      }
    }
    if (args->verify) verifyModels(reader, paths.front().string());  // what a load checks before anything runs
    const std::string text = args->json ? dumpJson(reader, options) : dumpText(reader, options);
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (!args->json && !options.any()) {
      std::fputs("(use --all, or -m -a -u -e -t -f -o, to see the blobs' contents)\n", stdout);
    }
    return 0;
  };
}

}  // namespace kiln::cli

// Descriptions of a package for people (text) and programs (JSON): what
// `kiln dump` prints.
//
// Thread safety: pure functions of a PackageReader.
#pragma once

#include <string>

#include "kiln/package_reader.h"

namespace kiln {

struct DumpOptions {
  bool metadata = false;      // -m: Metadata blobs, all fields
  bool anchors = false;       // -a: all anchors, split input/output and user/package-provided
  bool user_anchors = false;  // -u: only the anchors the user provides
  bool executables = false;   // -e
  bool tensors = false;       // -t
  bool feeds = false;         // -f
  bool opaques = false;       // -o
  bool color = false;         // -c: ANSI colours

  static DumpOptions all();
  bool any() const;
};

// The text form, after the reference tool's layout.
std::string dumpText(const PackageReader& reader, const DumpOptions& options);

// One JSON document; the sections selected by `options` are present.
std::string dumpJson(const PackageReader& reader, const DumpOptions& options);

}  // namespace kiln

// The kiln package format: one include for all of it.
//
//   kiln/dtype.h, kiln/tensor_info.h  element types and shapes
//   kiln/metadata.h                   Metadata, Anchor, program flow
//   kiln/blob.h                       blob types and views
//   kiln/package_reader.h             PackageReader (mmap, validation)
//   kiln/package_writer.h             PackageWriter, BlobWriter (streaming)
//   kiln/dump.h                       human and JSON descriptions (kiln dump)
//
// docs/format.md specifies the bytes.
#pragma once

#include "kiln/blob.h"
#include "kiln/dtype.h"
#include "kiln/dump.h"
#include "kiln/error.h"
#include "kiln/metadata.h"
#include "kiln/package_reader.h"
#include "kiln/package_writer.h"
#include "kiln/tensor_info.h"
#include "kiln/version.h"

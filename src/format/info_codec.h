// Encoding and decoding of the typed "info" section of each blob
// (docs/format.md, "Info sections"). Decoders check every count and length
// against the bytes that remain and throw FormatError with the absolute
// offset of the offending field; they never read outside the section.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/byte_io.h"
#include "kiln/metadata.h"
#include "kiln/tensor_info.h"

namespace kiln {

void encodeTensorInfo(ByteWriter& out, const TensorInfo& info);
TensorInfo decodeTensorInfo(ByteCursor& in);

std::vector<std::byte> encodeMetadata(const Metadata& metadata);
Metadata decodeMetadata(ByteCursor& in);

struct FeedInfo {
  TensorInfo tensor;
  uint64_t count = 0;
};
std::vector<std::byte> encodeFeedInfo(const FeedInfo& feed);
FeedInfo decodeFeedInfo(ByteCursor& in);

std::vector<std::byte> encodeTensorDataInfo(const TensorInfo& info);
std::vector<std::byte> encodeOpaqueInfo(const std::string& executable);

}  // namespace kiln

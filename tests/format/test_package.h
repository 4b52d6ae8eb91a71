// Helpers shared by the format tests: a temporary directory, file I/O, and a
// small valid package whose blobs the malformed-input tests mutate.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "format/blob_header.h"
#include "kiln/format.h"

namespace kiln::testing {

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::random_device random;
    path_ = std::filesystem::temp_directory_path() / ("kiln-test-" + std::to_string(random()) + std::to_string(random()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::vector<std::byte> readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

inline void writeFile(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
std::span<const std::byte> bytesOf(const std::vector<T>& values) {
  return std::as_bytes(std::span(values.data(), values.size()));
}

inline std::span<const std::byte> bytesOf(const std::string& text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

// Bytes 0, 1, 2, ... (mod 251) so that a shifted or truncated copy differs.
inline std::vector<std::byte> patternBytes(size_t size, unsigned seed = 0) {
  std::vector<std::byte> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>((i + seed) % 251);
  return bytes;
}

inline Anchor makeAnchor(std::string name, AnchorDirection direction, TensorInfo info, std::vector<uint32_t> programs) {
  Anchor anchor;
  anchor.handle = (direction == AnchorDirection::kInput ? "h2d_" : "d2h_") + name;
  anchor.name = std::move(name);
  anchor.direction = direction;
  anchor.info = std::move(info);
  anchor.programs = std::move(programs);
  return anchor;
}

// Metadata for executable `executable` with a user input "x", a weight
// input "w" (f32 [2, 3]) and an output "y".
inline Metadata makeMetadata(const std::string& executable) {
  Metadata m;
  m.executable = executable;
  m.target = {"cpu", 1, {"avx2"}};
  m.options = {{"threads", "2"}};
  m.programs = {{0, "load"}, {1, "main"}, {2, "save"}};
  m.program_flow = {.load = {0}, .main = {1}, .save = {2}};
  m.anchors = {makeAnchor("x", AnchorDirection::kInput, {DType::kF32, {4, 3}}, {1}),
               makeAnchor("w", AnchorDirection::kInput, {DType::kF32, {2, 3}}, {0}),
               makeAnchor("y", AnchorDirection::kOutput, {DType::kF32, {4, 2}}, {1})};
  m.anchors[0].batch_dim = 0;
  return m;
}

// Blob 0: Executable "exe" (uncompressed, 100 bytes); blob 1: Metadata
// "model"; blob 2: TensorData "w" (f32 [2, 3]).
inline void writeSmallPackage(const std::filesystem::path& path) {
  PackageWriter writer(path);
  writer.writeExecutable("exe", patternBytes(100));
  writer.writeMetadata("model", makeMetadata("exe"));
  const std::vector<float> weights = {1, 2, 3, 4, 5, 6};
  writer.writeTensorData("w", {DType::kF32, {2, 3}}, bytesOf(weights));
  writer.close();
}

// Offsets of every blob header in `file`.
inline std::vector<uint64_t> blobOffsets(std::span<const std::byte> file) {
  std::vector<uint64_t> offsets;
  walkBlobChain(file, "test", [&](const BlobHeader&, uint64_t offset) { offsets.push_back(offset); });
  return offsets;
}

template <typename T>
void poke(std::vector<std::byte>& file, uint64_t offset, T value) {
  std::memcpy(file.data() + offset, &value, sizeof(T));
}

template <typename T>
T peek(const std::vector<std::byte>& file, uint64_t offset) {
  T value;
  std::memcpy(&value, file.data() + offset, sizeof(T));
  return value;
}

// Recomputes the header checksum of the blob at `offset` after a test
// changed its header, name or info, so that the reader reaches the check
// the test is about.
inline void resealHeader(std::vector<std::byte>& file, uint64_t offset) {
  const auto header_size = peek<uint32_t>(file, offset + 12);
  const auto name_size = peek<uint32_t>(file, offset + 72);
  const auto info_size = peek<uint32_t>(file, offset + 76);
  const std::span<const std::byte> all(file);
  poke(file, offset + kHeaderChecksumOffset,
       computeHeaderChecksum(all.subspan(offset, header_size), all.subspan(offset + header_size, name_size),
                             all.subspan(offset + header_size + name_size, info_size)));
}

}  // namespace kiln::testing

// A whole file mapped read-only into memory.
//
// Pages are loaded on first touch, so mapping a large file costs almost
// nothing until its bytes are read. The mapping is MAP_PRIVATE: a file
// changed by another process after mapping may or may not show the change,
// so packages must not be rewritten while they are open.
//
// Ownership: unmaps on destruction; movable, not copyable.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

namespace kiln {

class MappedFile {
 public:
  // Throws IoError when the file cannot be opened or mapped. An empty file
  // gives an empty span.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kiln

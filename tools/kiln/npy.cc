#include "tools/kiln/npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <fstream>
#include <regex>

#include "kiln/error.h"

namespace kiln::cli {
namespace {

struct Descr {
  const char* text;
  DType dtype;
};
constexpr Descr kDescrs[] = {{"<f4", DType::kF32}, {"<f8", DType::kF64}, {"<f2", DType::kF16}, {"<i8", DType::kI64},
                             {"<i4", DType::kI32}, {"<i2", DType::kI16}, {"|i1", DType::kI8},  {"|u1", DType::kU8},
                             {"<u2", DType::kU16}, {"<u4", DType::kU32}, {"<u8", DType::kU64}, {"|b1", DType::kBool}};

}  // namespace

NpyArray readNpy(const std::filesystem::path& path) {
  auto fail = [&](const std::string& problem) { throw UsageError(fmt::format("{}: {}", path.string(), problem)); };
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open");
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail("not a .npy file (bad magic)");
  uint32_t header_size = 0;
  if (magic[6] == 1) {
    uint16_t size16 = 0;
    in.read(reinterpret_cast<char*>(&size16), 2);
    header_size = size16;
  } else if (magic[6] == 2 || magic[6] == 3) {
    in.read(reinterpret_cast<char*>(&header_size), 4);
  } else {
    fail(fmt::format("unknown .npy version {}", static_cast<int>(magic[6])));
  }
  if (!in || header_size > (1u << 20)) fail("truncated or oversized header");
  std::string header(header_size, '\0');
  if (!in.read(header.data(), header_size)) fail("truncated header");

  std::smatch match;
  if (!std::regex_search(header, match, std::regex(R"('descr'\s*:\s*'([^']+)')"))) fail("header has no 'descr'");
  const std::string descr = match[1];
  NpyArray array;
  const auto* found = std::find_if(std::begin(kDescrs), std::end(kDescrs), [&](const Descr& d) { return descr == d.text; });
  if (found == std::end(kDescrs)) fail(fmt::format("element type '{}' is not supported (little-endian numbers only)", descr));
  array.info.dtype = found->dtype;
  if (std::regex_search(header, std::regex(R"('fortran_order'\s*:\s*True)"))) fail("Fortran-order arrays are not supported");
  if (!std::regex_search(header, match, std::regex(R"('shape'\s*:\s*\(([^)]*)\))"))) fail("header has no 'shape'");
  const std::string dims = match[1];
  const std::regex number(R"(\d+)");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), number); it != std::sregex_iterator(); ++it) {
    array.info.shape.push_back(std::stoll(it->str()));
  }
  array.bytes.resize(array.info.sizeInBytes());
  if (!in.read(reinterpret_cast<char*>(array.bytes.data()), static_cast<std::streamsize>(array.bytes.size()))) {
    fail(fmt::format("holds fewer than the {} bytes its header announces", array.bytes.size()));
  }
  return array;
}

void writeNpy(const std::filesystem::path& path, const TensorInfo& info, const std::byte* data) {
  const auto* found =
      std::find_if(std::begin(kDescrs), std::end(kDescrs), [&](const Descr& d) { return d.dtype == info.dtype; });
  if (found == std::end(kDescrs)) throw UsageError(fmt::format("cannot write {} as .npy", dtypeName(info.dtype)));
  std::string shape = info.shape.size() == 1 ? fmt::format("{},", info.shape[0]) : fmt::format("{}", fmt::join(info.shape, ", "));
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", found->text, shape);
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw IoError("cannot create " + path.string(), errno);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto size16 = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&size16), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(info.sizeInBytes()));
  if (!out) throw IoError("cannot write " + path.string(), errno);
}

}  // namespace kiln::cli

#include "tools/kiln/npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// The header is a Python dict literal, {'descr': '<f4', 'fortran_order':
// False, 'shape': (2, 3), } (numpy writes exactly these keys). A small
// recursive-descent reader over it, not std::regex: regex matching recurses
// per character, and a crafted 60 KB header overflowed the stack.
class HeaderReader {
 public:
  HeaderReader(const std::string& text, const std::function<void(const std::string&)>& fail)
      : text_(text), fail_(fail) {}

  // Reads the dict; calls `field` with each key, positioned at its value.
  template <typename Field>
  void dict(const Field& field) {
    expect('{');
    while (!take('}')) {
      const std::string key = quoted();
      expect(':');
      field(key);
      if (!take(',')) {
        expect('}');
        break;
      }
    }
  }

  std::string quoted() {
    skipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) fail_("header: expected a quoted string");
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string::npos) fail_("header: unterminated string");
    std::string value = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return value;
  }

  bool boolean() {
    skipSpace();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (text_.compare(pos_, std::strlen(word), word) == 0) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    fail_("header: expected True or False");
    return false;
  }

  // A tuple of dimensions: "()", "(4,)", "(2, 3)". Each is at most
  // kMaxDimension, and there are at most kMaxRank of them.
  std::vector<int64_t> dims() {
    expect('(');
    std::vector<int64_t> out;
    while (!take(')')) {
      skipSpace();
      if (pos_ < text_.size() && text_[pos_] == '-') fail_("header: a negative dimension");
      if (pos_ >= text_.size() || !std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        fail_("header: expected a dimension");
      }
      int64_t dim = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        const int digit = text_[pos_++] - '0';
        // Checked before multiplying: the product itself must not overflow.
        if (dim > (kMaxDimension - digit) / 10) fail_("header: a dimension above 2^62");
        dim = dim * 10 + digit;
      }
      out.push_back(dim);
      if (out.size() > kMaxRank) fail_(fmt::format("header: more than {} dimensions", kMaxRank));
      if (!take(',')) {
        expect(')');
        break;
      }
    }
    return out;
  }

 private:
  static constexpr int64_t kMaxDimension = int64_t{1} << 62;

  void skipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool take(char c) {
    skipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail_(fmt::format("header: expected '{}'", c));
  }

  const std::string& text_;
  const std::function<void(const std::string&)>& fail_;
  size_t pos_ = 0;
};

}  // namespace

NpyArray readNpy(const std::filesystem::path& path) {
  const std::function<void(const std::string&)> fail = [&](const std::string& problem) {
    throw UsageError(fmt::format("{}: {}", path.string(), problem));
  };
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

  std::optional<std::string> descr;
  std::optional<std::vector<int64_t>> shape;
  bool fortran_order = false;
  HeaderReader reader(header, fail);
  reader.dict([&](const std::string& key) {
    if (key == "descr") {
      descr = reader.quoted();
    } else if (key == "fortran_order") {
      fortran_order = reader.boolean();
    } else if (key == "shape") {
      shape = reader.dims();
    } else {
      fail(fmt::format("header: unknown key '{}'", key));
    }
  });
  if (!descr) fail("header has no 'descr'");
  if (!shape) fail("header has no 'shape'");
  const auto* found = std::find_if(std::begin(kDescrs), std::end(kDescrs), [&](const Descr& d) { return *descr == d.text; });
  if (found == std::end(kDescrs)) fail(fmt::format("element type '{}' is not supported (little-endian numbers only)", *descr));
  if (fortran_order) fail("Fortran-order arrays are not supported");

  // The data's size, checked: a zero dimension makes it 0 whatever the
  // others; otherwise every product must fit. Then the file must hold that
  // many bytes before anything is allocated for them.
  NpyArray array;
  array.info.dtype = found->dtype;
  array.info.shape = *shape;
  const std::optional<int64_t> elements = elementCount(*shape);
  const std::optional<int64_t> size =
      elements ? multiplySizes(*elements, static_cast<int64_t>(dtypeSize(found->dtype))) : std::nullopt;
  if (!size) fail(fmt::format("shape ({}) is too large", fmt::join(*shape, ", ")));
  const auto bytes = static_cast<uint64_t>(*size);
  const std::streamoff data_start = in.tellg();
  in.seekg(0, std::ios::end);
  const std::streamoff file_end = in.tellg();
  if (data_start < 0 || file_end < data_start || static_cast<uint64_t>(file_end - data_start) < bytes) {
    fail(fmt::format("holds fewer than the {} bytes its header announces", bytes));
  }
  in.seekg(data_start);
  array.bytes.resize(bytes);
  if (!in.read(reinterpret_cast<char*>(array.bytes.data()), static_cast<std::streamsize>(array.bytes.size()))) {
    fail(fmt::format("holds fewer than the {} bytes its header announces", bytes));
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

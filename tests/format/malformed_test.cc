// Every kind of malformed input the reader must refuse: each case mutates a
// valid package and expects a FormatError naming the source, the byte offset
// and the problem. Never a crash, never a read outside the input (the ASan
// build checks that, since these inputs live in exactly-sized heap buffers).
#include <gtest/gtest.h>

#include <functional>

#include "format/info_codec.h"
#include "kiln/log.h"
#include "tests/format/test_package.h"

namespace kiln {
namespace {

using testing::peek;
using testing::poke;
using testing::resealHeader;

// The small package: blob 0 Executable "exe", blob 1 Metadata "model", blob
// 2 TensorData "w".
struct Layout {
  uint64_t exe, model, w;
};

struct MalformedCase {
  std::string name;
  std::function<void(std::vector<std::byte>&, const Layout&)> mutate;
  std::function<uint64_t(const Layout&, const std::vector<std::byte>&)> expected_offset;
  std::string expected_problem;
};

std::ostream& operator<<(std::ostream& out, const MalformedCase& c) { return out << c.name; }

std::vector<std::byte> smallPackage() {
  testing::TempDir dir;
  testing::writeSmallPackage(dir / "p.kiln");
  return testing::readFile(dir / "p.kiln");
}

uint64_t payloadOf(const std::vector<std::byte>& file, uint64_t blob) { return blob + peek<uint64_t>(file, blob + 32); }
uint64_t infoOf(const std::vector<std::byte>& file, uint64_t blob) {
  return blob + peek<uint32_t>(file, blob + 12) + peek<uint32_t>(file, blob + 72);
}

// Replaces the info section of the blob at `blob` with `info` (same size or
// smaller, padded with the old trailing bytes cut) and reseals the header.
void replaceInfo(std::vector<std::byte>& file, uint64_t blob, const std::vector<std::byte>& info) {
  const auto old_size = peek<uint32_t>(file, blob + 76);
  ASSERT_LE(info.size(), old_size + (peek<uint64_t>(file, blob + 32) - (infoOf(file, blob) - blob) - old_size));
  std::memcpy(file.data() + infoOf(file, blob), info.data(), info.size());
  poke(file, blob + 76, static_cast<uint32_t>(info.size()));
  resealHeader(file, blob);
}

const std::vector<MalformedCase>& cases() {
  static const std::vector<MalformedCase> all = {
      {"EmptyFile", [](auto& f, auto&) { f.clear(); }, [](auto&, auto&) { return 0; }, "empty file"},
      {"TruncatedInsideFirstHeader", [](auto& f, auto&) { f.resize(100); }, [](auto&, auto&) { return 0; },
       "truncated blob header"},
      {"TruncatedInsidePayload", [](auto& f, const Layout& l) { f.resize(l.w + 150); },
       [](const Layout& l, auto&) { return l.w + 24; }, "only 150 remain in the file (truncated file?)"},
      {"TrailingGarbageAfterLastBlob", [](auto& f, auto&) { f.resize(f.size() + 17); },
       [](auto&, auto& f) { return f.size() - 17; }, "truncated blob header"},
      {"BadMagic", [](auto& f, const Layout& l) { f[l.model + 3] = std::byte{'X'}; },
       [](const Layout& l, auto&) { return l.model; }, "bad magic: expected 'KILNBLOB', found 'KILXBLOB'"},
      {"NewerMajorVersion", [](auto& f, const Layout& l) { poke<uint16_t>(f, l.exe + 8, 2); },
       [](const Layout& l, auto&) { return l.exe + 8; },
       "format version 2.0 is newer than this build supports (1.0)"},
      {"VersionZero", [](auto& f, const Layout& l) { poke<uint16_t>(f, l.exe + 8, 0); },
       [](const Layout& l, auto&) { return l.exe + 8; }, "invalid format version"},
      {"HeaderSizeTooSmall", [](auto& f, const Layout& l) { poke<uint32_t>(f, l.exe + 12, 64); },
       [](const Layout& l, auto&) { return l.exe + 12; }, "header size 64 is invalid"},
      {"TotalSizeOverflow", [](auto& f, const Layout& l) { poke<uint64_t>(f, l.model + 24, ~uint64_t{63}); },
       [](const Layout& l, auto&) { return l.model + 24; }, "remain in the file"},
      {"IncompleteBlobLeftByAStoppedWriter", [](auto& f, const Layout& l) { poke<uint64_t>(f, l.w + 24, 0); },
       [](const Layout& l, auto&) { return l.w + 24; }, "incomplete blob (total size 0)"},
      {"TotalSizeNotMultipleOf64", [](auto& f, const Layout& l) { poke<uint64_t>(f, l.exe + 24, 300); },
       [](const Layout& l, auto&) { return l.exe + 24; }, "total size 300 is not a multiple of 64"},
      {"TotalSizeDisagreesWithPayload",
       [](auto& f, const Layout& l) { poke<uint64_t>(f, l.exe + 24, peek<uint64_t>(f, l.exe + 24) + 64); },
       [](const Layout& l, auto&) { return l.exe + 24; }, "disagrees with payload offset"},
      {"PayloadOffsetOverflow", [](auto& f, const Layout& l) { poke<uint64_t>(f, l.w + 32, ~uint64_t{63}); },
       [](const Layout& l, auto&) { return l.w + 40; }, "runs past the end of the blob"},
      {"MisalignedPayload",
       [](auto& f, const Layout& l) { poke<uint64_t>(f, l.exe + 32, peek<uint64_t>(f, l.exe + 32) + 8); },
       [](const Layout& l, auto&) { return l.exe + 32; }, "is not 64-byte aligned"},
      {"StoredSizeRunsPastBlob", [](auto& f, const Layout& l) { poke<uint64_t>(f, l.exe + 40, 1 << 20); },
       [](const Layout& l, auto&) { return l.exe + 40; }, "runs past the end of the blob"},
      {"RawSizeDisagreesWhenUncompressed", [](auto& f, const Layout& l) { poke<uint64_t>(f, l.exe + 48, 99); },
       [](const Layout& l, auto&) { return l.exe + 48; }, "raw size 99 differs from stored size 100"},
      {"UnknownFlags", [](auto& f, const Layout& l) { poke<uint32_t>(f, l.exe + 20, 0x10); },
       [](const Layout& l, auto&) { return l.exe + 20; }, "unknown flags 0x10"},
      {"EmptyName", [](auto& f, const Layout& l) { poke<uint32_t>(f, l.exe + 72, 0); },
       [](const Layout& l, auto&) { return l.exe + 72; }, "blob name is empty"},
      {"NameRunsPastPayloadOffset", [](auto& f, const Layout& l) { poke<uint32_t>(f, l.model + 72, 4000); },
       [](const Layout& l, auto&) { return l.model + 72; }, "run past the payload offset"},
      {"NameSizeHuge", [](auto& f, const Layout& l) { poke<uint32_t>(f, l.model + 72, 0xFFFFFFFF); },
       [](const Layout& l, auto&) { return l.model + 72; }, "exceeds the limit"},
      {"InfoRunsPastPayloadOffset", [](auto& f, const Layout& l) { poke<uint32_t>(f, l.w + 76, 0xFFFFFFF0); },
       [](const Layout& l, auto&) { return l.w + 72; }, "run past the payload offset"},
      {"NameWithNulByte",
       [](auto& f, const Layout& l) {
         f[l.exe + 129] = std::byte{0};
         resealHeader(f, l.exe);
       },
       [](const Layout& l, auto&) { return l.exe + 128; }, "NUL byte"},
      {"HeaderChecksumMismatch", [](auto& f, const Layout& l) { f[l.model + 128] = std::byte{'M'}; },
       [](const Layout& l, auto&) { return l.model + 64; }, "header checksum mismatch"},
      {"PayloadChecksumMismatch", [](auto& f, const Layout& l) { f[payloadOf(f, l.exe) + 10] ^= std::byte{1}; },
       [](const Layout& l, auto& f) { return payloadOf(f, l.exe); }, "payload checksum mismatch in Executable 'exe'"},
      {"CompressedRawSizeBeyondZstdRatio",
       [](auto& f, const Layout& l) {
         poke<uint32_t>(f, l.exe + 20, kBlobFlagCompressed);
         poke<uint64_t>(f, l.exe + 48, peek<uint64_t>(f, l.exe + 40) * 32768 + 32768);
         resealHeader(f, l.exe);
       },
       [](const Layout& l, auto&) { return l.exe + 48; }, "zstd expands at most 32768 times"},
      {"CompressedTensorData",
       [](auto& f, const Layout& l) {
         poke<uint32_t>(f, l.w + 20, kBlobFlagCompressed);
         resealHeader(f, l.w);
       },
       [](const Layout& l, auto&) { return l.w + 20; }, "only Executable payloads may be compressed"},
      {"TensorSizeDisagreesWithTensorInfo",
       [](auto& f, const Layout& l) {
         ByteWriter info;
         encodeTensorInfo(info, {DType::kF32, {2, 2}});
         replaceInfo(f, l.w, info.bytes());
       },
       [](const Layout& l, auto&) { return l.w + 40; }, "payload is 24 bytes, not 16"},
      {"UnknownDType",
       [](auto& f, auto& l) {
         f[infoOf(f, l.w)] = std::byte{8};
         resealHeader(f, l.w);
       },
       [](const Layout& l, auto& f) { return infoOf(f, l.w); }, "unknown dtype code 8"},
      {"RankTooLarge",
       [](auto& f, auto& l) {
         poke<uint32_t>(f, infoOf(f, l.w) + 1, 1000);
         resealHeader(f, l.w);
       },
       [](const Layout& l, auto& f) { return infoOf(f, l.w) + 1; }, "rank 1000 exceeds the limit of 32"},
      {"NegativeDimension",
       [](auto& f, auto& l) {
         poke<int64_t>(f, infoOf(f, l.w) + 5, -7);
         resealHeader(f, l.w);
       },
       [](const Layout& l, auto& f) { return infoOf(f, l.w) + 5; }, "dimension 0 is -7"},
      {"DynamicTensorData",
       [](auto& f, auto& l) {
         poke<int64_t>(f, infoOf(f, l.w) + 5, -1);
         resealHeader(f, l.w);
       },
       [](const Layout& l, auto& f) { return infoOf(f, l.w); }, "must have a static shape"},
      {"InfoTruncated",
       [](auto& f, auto& l) {
         poke<uint32_t>(f, l.w + 76, 7);
         resealHeader(f, l.w);
       },
       [](const Layout& l, auto& f) { return infoOf(f, l.w) + 5; }, "dimension needs 8 bytes but only 2 remain"},
      {"InfoTrailingBytes",
       [](auto& f, auto& l) {
         poke<uint32_t>(f, l.w + 76, peek<uint32_t>(f, l.w + 76) + 3);
         resealHeader(f, l.w);
       },
       [](const Layout& l, auto& f) { return infoOf(f, l.w) + 21; }, "3 unexpected trailing bytes"},
      {"MetadataListCountTooLarge",
       [](auto& f, auto& l) {
         // The feature list count of the metadata (after "exe" and "cpu" strings and num_devices).
         poke<uint32_t>(f, infoOf(f, l.model) + 4 + 3 + 4 + 3 + 4, 0x7FFFFFFF);
         resealHeader(f, l.model);
       },
       [](const Layout& l, auto& f) { return infoOf(f, l.model) + 18; }, "target.features says 2147483647 items"},
      {"MetadataInvalid",
       [](auto& f, auto& l) {
         Metadata m = testing::makeMetadata("exe");
         m.programs.erase(2);  // program flow 'save' now refers to a missing program
         replaceInfo(f, l.model, encodeMetadata(m));
       },
       [](const Layout& l, auto& f) { return infoOf(f, l.model); }, "program flow 'save' refers to program 2"},
      {"AnchorSizeOverflows",
       [](auto& f, auto& l) {
         Metadata m = testing::makeMetadata("exe");
         m.anchors[0].info.shape = {int64_t{1} << 40, int64_t{1} << 30};
         replaceInfo(f, l.model, encodeMetadata(m));
       },
       [](const Layout& l, auto& f) { return infoOf(f, l.model); }, "anchor 'x' has a size that overflows 63 bits"},
      {"MetadataNamesMissingExecutable",
       [](auto& f, auto& l) {
         Metadata m = testing::makeMetadata("exf");
         replaceInfo(f, l.model, encodeMetadata(m));
       },
       [](const Layout& l, auto&) { return l.model; }, "names executable 'exf', which is in none of the files read"},
      {"AnchorDisagreesWithTensorData",
       [](auto& f, auto& l) {
         Metadata m = testing::makeMetadata("exe");
         m.anchors[1].info = {DType::kF32, {3, 2}};
         replaceInfo(f, l.model, encodeMetadata(m));
       },
       [](const Layout& l, auto&) { return l.model; },
       "anchor 'w' of metadata 'model' expects { dtype: F32, sizeInBytes: 24, shape [3, 2] } but TensorData 'w'"},
      {"DuplicateName",
       [](auto& f, auto& l) {
         const std::vector<std::byte> copy(f.begin() + static_cast<std::ptrdiff_t>(l.w), f.end());
         f.insert(f.end(), copy.begin(), copy.end());  // TensorData "w" twice
       },
       [](const Layout& l, auto& f) { return f.size() - (f.size() - l.w) / 2; },
       "duplicate TensorData name 'w' (first at bad.kiln byte"},
  };
  return all;
}

class Malformed : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(Malformed, IsRefusedWithOffsetAndReason) {
  const MalformedCase& c = GetParam();
  std::vector<std::byte> file = smallPackage();
  const auto offsets = testing::blobOffsets(file);
  ASSERT_EQ(offsets.size(), 3u);
  const Layout layout{offsets[0], offsets[1], offsets[2]};
  c.mutate(file, layout);
  // An exactly-sized heap copy, so that ASan catches any read past the end.
  auto exact = std::make_unique<std::byte[]>(file.size());
  std::copy(file.begin(), file.end(), exact.get());
  try {
    const PackageReader reader =
        PackageReader::fromMemory({{"bad.kiln", {exact.get(), file.size()}}}, {.checksums = ChecksumPolicy::kEager});
    FAIL() << "the reader accepted a malformed package";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.source(), "bad.kiln");
    EXPECT_EQ(e.offset(), c.expected_offset(layout, file)) << e.what();
    EXPECT_NE(std::string(e.what()).find(c.expected_problem), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Reader, Malformed, ::testing::ValuesIn(cases()),
                         [](const auto& test) { return test.param.name; });

TEST(MalformedFile, ErrorsNameTheFile) {
  testing::TempDir dir;
  std::vector<std::byte> file = smallPackage();
  file.resize(file.size() - 64);
  testing::writeFile(dir / "cut.kiln", file);
  try {
    const PackageReader reader(dir / "cut.kiln");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_EQ(e.source(), (dir / "cut.kiln").string());
    EXPECT_EQ(std::string(e.what()).rfind((dir / "cut.kiln").string() + ": byte ", 0), 0u) << e.what();
  }
  EXPECT_THROW(PackageReader(dir / "absent.kiln"), IoError);
  EXPECT_THROW(PackageReader(std::filesystem::path("/")), IoError);
}

TEST(MalformedFile, UnknownBlobTypeIsSkippedWithAWarning) {
  std::vector<std::byte> file = smallPackage();
  const auto offsets = testing::blobOffsets(file);
  poke<uint32_t>(file, offsets[2] + 16, 77);  // TensorData "w" becomes type 77
  resealHeader(file, offsets[2]);
  std::vector<std::string> warnings;
  const LogSink previous = setLogSink([&](LogLevel level, std::string_view message) {
    if (level == LogLevel::kWarning) warnings.emplace_back(message);
  });
  const PackageReader reader = PackageReader::fromMemory({{"m", file}});
  setLogSink(previous);
  EXPECT_EQ(reader.blobs().size(), 3u);
  EXPECT_EQ(reader.findTensorData("w"), nullptr);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("skipping blob 'w' of unknown type 77"), std::string::npos) << warnings[0];
}

TEST(MalformedFile, NewerMinorVersionMayAppendInfoFields) {
  std::vector<std::byte> file = smallPackage();
  const auto offsets = testing::blobOffsets(file);
  poke<uint16_t>(file, offsets[2] + 10, kFormatVersionMinor + 1);
  poke<uint32_t>(file, offsets[2] + 76, peek<uint32_t>(file, offsets[2] + 76) + 3);
  resealHeader(file, offsets[2]);
  const PackageReader reader = PackageReader::fromMemory({{"m", file}}, {.checksums = ChecksumPolicy::kEager});
  EXPECT_EQ(reader.findTensorData("w")->tensorInfo(), (TensorInfo{DType::kF32, {2, 3}}));
}

TEST(MalformedFile, CorruptCompressedExecutableFailsOnRead) {
  testing::TempDir dir;
  {
    PackageWriter writer(dir / "c.kiln");
    writer.writeExecutable("exe", testing::patternBytes(5000), /*compress=*/true);
  }
  std::vector<std::byte> file = testing::readFile(dir / "c.kiln");
  const uint64_t payload = payloadOf(file, 0);
  poke<uint64_t>(file, 48, 4999);  // raw size disagrees with the frame
  resealHeader(file, 0);
  const PackageReader reader = PackageReader::fromMemory({{"m", file}});
  EXPECT_THROW(reader.findExecutable("exe")->read(), FormatError);

  file[payload + 20] ^= std::byte{0xFF};  // and the frame itself is damaged
  poke<uint64_t>(file, 48, 5000);
  resealHeader(file, 0);
  const PackageReader trusting = PackageReader::fromMemory({{"m", file}}, {.checksums = ChecksumPolicy::kSkip});
  EXPECT_THROW(trusting.findExecutable("exe")->read(), FormatError);
}

}  // namespace
}  // namespace kiln

// Everything written comes back unchanged: every blob type, every dtype,
// several models in one file, one model over several files, compression,
// append mode, memory sources, checksum policies.
#include <gtest/gtest.h>

#include "tests/format/test_package.h"

namespace kiln {
namespace {

using testing::bytesOf;
using testing::makeMetadata;
using testing::patternBytes;
using testing::TempDir;

bool sameBytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

TEST(RoundTrip, EveryDTypeAsTensorData) {
  TempDir dir;
  const auto path = dir / "dtypes.kiln";
  {
    PackageWriter writer(path);
    for (DType dtype : allDTypes()) {
      const TensorInfo info{dtype, {3, 2}};
      writer.writeTensorData(std::string(dtypeName(dtype)), info,
                             patternBytes(info.sizeInBytes(), static_cast<unsigned>(dtype)));
    }
  }
  const PackageReader reader(path);
  ASSERT_EQ(reader.tensorData().size(), allDTypes().size());
  for (DType dtype : allDTypes()) {
    const TensorDataBlob* blob = reader.findTensorData(dtypeName(dtype));
    ASSERT_NE(blob, nullptr) << dtypeName(dtype);
    EXPECT_EQ(blob->tensorInfo(), (TensorInfo{dtype, {3, 2}}));
    EXPECT_TRUE(sameBytes(blob->data(), patternBytes(6 * dtypeSize(dtype), static_cast<unsigned>(dtype))));
    // Zero copy: the span points into the mapping, 64-byte aligned.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(blob->data().data()) % 64, 0u);
  }
}

TEST(RoundTrip, EveryBlobTypeWithAllFields) {
  TempDir dir;
  const auto path = dir / "all.kiln";
  Metadata metadata = makeMetadata("exe");
  metadata.replication_factor = 2;
  metadata.is_inference = false;
  metadata.target.features = {"avx512f", "bf16"};
  metadata.anchors[0].is_per_replica = true;
  metadata.anchors[0].use_remote_buffers = true;
  metadata.anchors[0].repeats = 3;
  metadata.anchors[0].info.shape = {kDynamicDim, 3};
  const auto program = patternBytes(3 << 20);  // 3 MiB, more than one writer buffer
  const std::vector<float> weights = {1, 2, 3, 4, 5, 6};
  const auto feed = patternBytes(5 * 4 * 3 * 4, 9);
  {
    PackageWriter writer(path);
    writer.writeExecutable("exe", program);
    writer.writeMetadata("model", metadata);
    writer.writeTensorData("w", {DType::kF32, {2, 3}}, bytesOf(weights));
    writer.writeFeedData("samples", {DType::kF32, {4, 3}}, 5, feed);
    writer.writeOpaque("framework", "exe", bytesOf(std::string("opaque bytes")));
    writer.writeOpaque("unlinked", "", {});
  }
  const PackageReader reader(path, {.checksums = ChecksumPolicy::kEager});
  ASSERT_EQ(reader.blobs().size(), 6u);
  EXPECT_EQ(reader.blobs()[0].producer, kProducer);
  EXPECT_EQ(reader.blobs()[0].offset, 0u);

  const ExecutableBlob* exe = reader.findExecutable("exe");
  ASSERT_NE(exe, nullptr);
  EXPECT_FALSE(exe->compressed());
  EXPECT_TRUE(sameBytes(exe->read(), program));

  const MetadataBlob* model = reader.findMetadata("model");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->metadata(), metadata);

  EXPECT_TRUE(sameBytes(reader.findTensorData("w")->data(), bytesOf(weights)));

  const FeedDataBlob* samples = reader.findFeedData("samples");
  ASSERT_NE(samples, nullptr);
  EXPECT_EQ(samples->count(), 5u);
  EXPECT_TRUE(sameBytes(samples->item(2), std::span(feed).subspan(2 * 48, 48)));
  EXPECT_THROW(samples->item(5), UsageError);

  EXPECT_EQ(reader.findOpaque("framework")->executable(), "exe");
  EXPECT_TRUE(sameBytes(reader.findOpaque("framework")->data(), bytesOf(std::string("opaque bytes"))));
  EXPECT_EQ(reader.findOpaque("unlinked")->executable(), "");
  EXPECT_TRUE(reader.findOpaque("unlinked")->data().empty());

  // w is package-provided, x and y are the user's.
  EXPECT_TRUE(reader.isPackageProvided(metadata.anchors[1]));
  EXPECT_FALSE(reader.isPackageProvided(metadata.anchors[0]));
  EXPECT_EQ(reader.findTensorData("nope"), nullptr);
}

TEST(RoundTrip, CompressedExecutableIsSmallerAndReadsBack) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "conv relu add ";
  const auto program = bytesOf(text);
  {
    PackageWriter writer(dir / "c.kiln");
    BlobWriter blob = writer.beginExecutable("exe", /*compress=*/true);
    for (size_t at = 0; at < program.size(); at += 7777) {  // streamed in odd pieces
      blob.write(program.subspan(at, std::min<size_t>(7777, program.size() - at)));
    }
  }
  const PackageReader reader(dir / "c.kiln");
  const ExecutableBlob* exe = reader.findExecutable("exe");
  ASSERT_NE(exe, nullptr);
  EXPECT_TRUE(exe->compressed());
  EXPECT_EQ(exe->size(), program.size());
  EXPECT_LT(exe->info().stored_size, program.size() / 20);
  EXPECT_TRUE(sameBytes(exe->read(), program));
}

TEST(RoundTrip, SeveralModelsInOneFile) {
  TempDir dir;
  {
    PackageWriter writer(dir / "two.kiln");
    writer.writeExecutable("exe-a", patternBytes(10));
    writer.writeExecutable("exe-b", patternBytes(20));
    Metadata a = makeMetadata("exe-a");
    Metadata b = makeMetadata("exe-b");
    b.anchors[1].name = "w_b";  // each model its own weights
    b.anchors[1].handle = "h2d_w_b";
    writer.writeMetadata("model-a", a);
    writer.writeMetadata("model-b", b);
    const std::vector<float> w(6, 1.0f);
    writer.writeTensorData("w", {DType::kF32, {2, 3}}, bytesOf(w));
    writer.writeTensorData("w_b", {DType::kF32, {2, 3}}, bytesOf(w));
  }
  const PackageReader reader(dir / "two.kiln");
  ASSERT_EQ(reader.metadata().size(), 2u);
  EXPECT_EQ(reader.findMetadata("model-a")->metadata().executable, "exe-a");
  EXPECT_EQ(reader.findMetadata("model-b")->metadata().executable, "exe-b");
  EXPECT_EQ(reader.findExecutable("exe-b")->read().size(), 20u);
}

TEST(RoundTrip, OneModelOverSeveralFiles) {
  TempDir dir;
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  {
    PackageWriter program(dir / "program.kiln");
    program.writeExecutable("exe", patternBytes(64));
    program.writeMetadata("model", makeMetadata("exe"));
    PackageWriter weights(dir / "weights.kiln");
    weights.writeTensorData("w", {DType::kF32, {2, 3}}, bytesOf(w));
  }
  const PackageReader both({dir / "program.kiln", dir / "weights.kiln"});
  EXPECT_EQ(both.sources().size(), 2u);
  EXPECT_EQ(both.findTensorData("w")->info().source, (dir / "weights.kiln").string());
  EXPECT_TRUE(both.isPackageProvided(both.findMetadata("model")->metadata().anchors[1]));

  // Alone, the program file is still a valid model whose weights are the user's.
  const PackageReader program_only(dir / "program.kiln");
  EXPECT_FALSE(program_only.isPackageProvided(program_only.findMetadata("model")->metadata().anchors[1]));

  // The same blob name in two files is a duplicate.
  try {
    const PackageReader twice({dir / "weights.kiln", dir / "weights.kiln"});
    FAIL() << "expected a duplicate-name error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate TensorData name 'w'"), std::string::npos) << e.what();
  }
}

TEST(RoundTrip, AppendAddsBlobsAfterExistingOnes) {
  TempDir dir;
  const auto path = dir / "grow.kiln";
  {
    PackageWriter writer(path);
    writer.writeExecutable("exe", patternBytes(10));
  }
  {
    PackageWriter writer(path, PackageWriter::Mode::kAppend);
    writer.writeMetadata("model", makeMetadata("exe"));
    EXPECT_THROW(writer.writeExecutable("exe", patternBytes(3)), UsageError);  // already in the file
  }
  {
    PackageWriter writer(path, PackageWriter::Mode::kAppend);
    const std::vector<float> w(6, 2.0f);
    writer.writeTensorData("w", {DType::kF32, {2, 3}}, bytesOf(w));
  }
  const PackageReader reader(path, {.checksums = ChecksumPolicy::kEager});
  EXPECT_EQ(reader.blobs().size(), 3u);
  EXPECT_NE(reader.findMetadata("model"), nullptr);
  EXPECT_NE(reader.findTensorData("w"), nullptr);
}

TEST(RoundTrip, AppendRefusesAFileThatIsNotAPackage) {
  TempDir dir;
  testing::writeFile(dir / "junk.kiln", patternBytes(300));
  EXPECT_THROW(PackageWriter(dir / "junk.kiln", PackageWriter::Mode::kAppend), FormatError);
  EXPECT_EQ(testing::readFile(dir / "junk.kiln"), patternBytes(300));  // unchanged
  EXPECT_THROW(PackageWriter(dir / "missing.kiln", PackageWriter::Mode::kAppend), IoError);
}

TEST(RoundTrip, ReadsFromMemoryAsFromFiles) {
  TempDir dir;
  testing::writeSmallPackage(dir / "small.kiln");
  const std::vector<std::byte> bytes = testing::readFile(dir / "small.kiln");
  const PackageReader reader = PackageReader::fromMemory({{"in-memory", bytes}});
  EXPECT_EQ(reader.sources(), std::vector<std::string>{"in-memory"});
  EXPECT_EQ(reader.findTensorData("w")->data().data(), bytes.data() + reader.findTensorData("w")->info().offset +
                                                           reader.findTensorData("w")->info().payload_offset);
}

TEST(RoundTrip, ChecksumPolicies) {
  TempDir dir;
  testing::writeSmallPackage(dir / "small.kiln");
  std::vector<std::byte> bytes = testing::readFile(dir / "small.kiln");
  const PackageReader good = PackageReader::fromMemory({{"good", bytes}});
  const uint64_t w_payload = good.findTensorData("w")->info().offset + good.findTensorData("w")->info().payload_offset;
  bytes[w_payload + 5] ^= std::byte{0x40};  // flip one bit of the weights

  EXPECT_THROW(PackageReader::fromMemory({{"bad", bytes}}, {.checksums = ChecksumPolicy::kEager}), FormatError);

  const PackageReader lazy = PackageReader::fromMemory({{"bad", bytes}});  // opens: payloads not read yet
  EXPECT_NO_THROW(lazy.findExecutable("exe")->read());                      // other blobs are fine
  for (int attempt = 0; attempt < 2; ++attempt) {                           // and it keeps failing
    try {
      (void)lazy.findTensorData("w")->data();
      FAIL() << "expected a checksum error";
    } catch (const FormatError& e) {
      EXPECT_EQ(e.offset(), w_payload);
      EXPECT_NE(std::string(e.what()).find("payload checksum mismatch in TensorData 'w'"), std::string::npos);
    }
  }
  const PackageReader trusting = PackageReader::fromMemory({{"bad", bytes}}, {.checksums = ChecksumPolicy::kSkip});
  EXPECT_EQ(trusting.findTensorData("w")->data().size(), 24u);
}

}  // namespace
}  // namespace kiln

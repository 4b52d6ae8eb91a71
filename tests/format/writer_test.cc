// The writer's contract: one active blob writer, streaming, declared sizes,
// validation before writing, and a file that never holds a half-written blob.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <iterator>
#include <stdexcept>

#include "tests/format/test_package.h"

namespace kiln {
namespace {

using testing::bytesOf;
using testing::makeMetadata;
using testing::patternBytes;
using testing::TempDir;

// The file a kCreate writer is writing: beside its path, renamed over it
// when close() succeeds.
std::filesystem::path fileBeingWritten(const std::filesystem::path& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) return entry.path();
  }
  ADD_FAILURE() << "no file being written in " << dir;
  return dir / "missing";
}

TEST(Writer, OnlyTheNewestBlobWriterIsActive) {
  TempDir dir;
  PackageWriter writer(dir / "p.kiln");
  BlobWriter first = writer.beginOpaque("first", "");
  first.write(patternBytes(10));
  BlobWriter second = writer.beginOpaque("second", "");
  EXPECT_FALSE(first.isActive());
  EXPECT_TRUE(second.isActive());
  try {
    first.write(patternBytes(1));
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("blob writer for 'first' is no longer active"), std::string::npos);
  }
  second.write(patternBytes(20));
  writer.close();
  EXPECT_THROW(second.write(patternBytes(1)), UsageError);
  EXPECT_THROW(writer.beginOpaque("third", ""), UsageError);

  const PackageReader reader(dir / "p.kiln");
  EXPECT_EQ(reader.findOpaque("first")->data().size(), 10u);  // finished when "second" began
  EXPECT_EQ(reader.findOpaque("second")->data().size(), 20u);
}

TEST(Writer, StreamsALargeTensorInPieces) {
  TempDir dir;
  const TensorInfo info{DType::kF32, {1024, 1024, 3}};  // 12 MiB
  const size_t piece = 1000003;                         // not a divisor of anything
  {
    PackageWriter writer(dir / "big.kiln");
    BlobWriter blob = writer.beginTensorData("big", info);
    for (uint64_t at = 0; at < info.sizeInBytes(); at += piece) {
      const size_t size = std::min<uint64_t>(piece, info.sizeInBytes() - at);
      blob.write(patternBytes(size, static_cast<unsigned>(at % 251)));
    }
  }
  const PackageReader reader(dir / "big.kiln", {.checksums = ChecksumPolicy::kEager});
  const auto data = reader.findTensorData("big")->data();
  ASSERT_EQ(data.size(), info.sizeInBytes());
  for (uint64_t at : {uint64_t{0}, uint64_t{piece - 1}, uint64_t{piece}, info.sizeInBytes() - 1}) {
    EXPECT_EQ(data[at], static_cast<std::byte>(at % 251)) << at;
  }
}

TEST(Writer, ShortTensorIsRefusedAndLeavesThePreviousBlobsIntact) {
  TempDir dir;
  const auto path = dir / "p.kiln";
  PackageWriter writer(path);
  writer.writeExecutable("exe", patternBytes(100));
  const auto size_before = std::filesystem::file_size(fileBeingWritten(dir.path()));
  BlobWriter blob = writer.beginTensorData("w", {DType::kF32, {1000}});
  blob.write(patternBytes(3996));  // 4 bytes short
  try {
    blob.close();
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("needs exactly 4000 payload bytes but 3996 were written"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(std::filesystem::file_size(fileBeingWritten(dir.path())), size_before);
  writer.writeOpaque("after", "exe", patternBytes(5));  // the writer goes on
  writer.close();
  const PackageReader reader(path, {.checksums = ChecksumPolicy::kEager});
  EXPECT_EQ(reader.blobs().size(), 2u);
  EXPECT_EQ(reader.findTensorData("w"), nullptr);
}

TEST(Writer, ABlobAfterAFailedOneIsWrittenNormally) {
  TempDir dir;
  PackageWriter writer(dir / "p.kiln");
  BlobWriter bad = writer.beginTensorData("short", {DType::kU8, {10}});
  bad.write(patternBytes(4));
  EXPECT_THROW(writer.beginExecutable("compressed", /*compress=*/true), UsageError);  // finishing "short" fails
  writer.writeExecutable("compressed", patternBytes(1000), /*compress=*/true);
  writer.writeExecutable("plain", patternBytes(10));
  writer.close();
  const PackageReader reader(dir / "p.kiln", {.checksums = ChecksumPolicy::kEager});
  EXPECT_EQ(reader.blobs().size(), 2u);
  EXPECT_TRUE(reader.findExecutable("compressed")->compressed());
  EXPECT_EQ(reader.findExecutable("compressed")->read(), patternBytes(1000));
  EXPECT_FALSE(reader.findExecutable("plain")->compressed());
  EXPECT_EQ(reader.findExecutable("plain")->read(), patternBytes(10));
}

// A write error in the middle of a compressed blob (here: the file-size
// limit, a transient error) rolls that blob back; the next blobs are written
// normally, uncompressed ones uncompressed.
TEST(Writer, AnIoErrorRollsTheBlobBackAndTheWriterGoesOn) {
  TempDir dir;
  const auto path = dir / "p.kiln";
  std::vector<std::byte> noise(4 << 20);
  std::mt19937 random(7);
  for (std::byte& b : noise) b = static_cast<std::byte>(random());  // incompressible

  rlimit original{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &original), 0);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  PackageWriter writer(path);
  writer.writeExecutable("first", patternBytes(100));
  const auto committed = std::filesystem::file_size(fileBeingWritten(dir.path()));
  rlimit limited = original;
  limited.rlim_cur = 1 << 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  try {
    writer.writeExecutable("big", noise, /*compress=*/true);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.errorNumber(), EFBIG);
    EXPECT_NE(std::string(e.what()).find("cannot write " + path.string()), std::string::npos) << e.what();
  }
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &original), 0);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_EQ(std::filesystem::file_size(fileBeingWritten(dir.path())), committed);  // rolled back

  writer.writeExecutable("plain", patternBytes(10));
  writer.close();
  const PackageReader reader(path, {.checksums = ChecksumPolicy::kEager});
  EXPECT_EQ(reader.blobs().size(), 2u);
  EXPECT_EQ(reader.findExecutable("big"), nullptr);
  EXPECT_FALSE(reader.findExecutable("plain")->compressed());
  EXPECT_EQ(reader.findExecutable("plain")->read(), patternBytes(10));
}

TEST(Writer, WritingPastTheDeclaredSizeIsRefusedAndChangesNothing) {
  TempDir dir;
  PackageWriter writer(dir / "p.kiln");
  BlobWriter blob = writer.beginTensorData("w", {DType::kU8, {10}});
  blob.write(patternBytes(8));
  EXPECT_THROW(blob.write(patternBytes(3)), UsageError);
  blob.write(patternBytes(2));  // still active; completes correctly
  writer.close();
  const PackageReader reader(dir / "p.kiln", {.checksums = ChecksumPolicy::kEager});
  EXPECT_EQ(reader.findTensorData("w")->data().size(), 10u);
}

TEST(Writer, InvalidArgumentsAreRefusedBeforeAnythingIsWritten) {
  TempDir dir;
  const auto path = dir / "p.kiln";
  PackageWriter writer(path);
  Metadata bad = makeMetadata("exe");
  bad.program_flow.main = {42};
  EXPECT_THROW(writer.writeMetadata("model", bad), UsageError);
  EXPECT_THROW(writer.beginExecutable(""), UsageError);
  EXPECT_THROW(writer.beginExecutable(std::string("a\0b", 3)), UsageError);
  EXPECT_THROW(writer.beginExecutable(std::string(5000, 'n')), UsageError);
  EXPECT_THROW(writer.beginTensorData("dyn", {DType::kF32, {kDynamicDim, 3}}), UsageError);
  EXPECT_THROW(writer.beginTensorData("undef", {DType::kUndefined, {3}}), UsageError);
  EXPECT_THROW(writer.beginFeedData("huge", {DType::kF64, {int64_t{1} << 40}}, uint64_t{1} << 40), UsageError);
  writer.close();
  EXPECT_EQ(std::filesystem::file_size(path), 0u);
}

TEST(Writer, DuplicateNamesAreRefusedPerNamespace) {
  TempDir dir;
  PackageWriter writer(dir / "p.kiln");
  writer.writeExecutable("x", patternBytes(1));
  writer.writeOpaque("x", "x", patternBytes(1));  // other namespace: fine
  writer.writeTensorData("t", {DType::kU8, {1}}, patternBytes(1));
  EXPECT_THROW(writer.writeFeedData("t", {DType::kU8, {1}}, 1, patternBytes(1)), UsageError);  // shared namespace
  writer.close();
  const PackageReader reader(dir / "p.kiln");
  EXPECT_EQ(reader.blobs().size(), 3u);
}

TEST(Writer, DestructorFinishesTheActiveBlob) {
  TempDir dir;
  {
    PackageWriter writer(dir / "p.kiln");
    writer.beginOpaque("o", "").write(patternBytes(77));
  }
  const PackageReader reader(dir / "p.kiln", {.checksums = ChecksumPolicy::kEager});
  EXPECT_EQ(reader.findOpaque("o")->data().size(), 77u);
}

// The package at the path stays as it was (here: absent); the file the
// writer left beside it ends in an incomplete blob, which readers refuse.
TEST(Writer, AWriterKilledMidBlobLeavesAnIncompleteBlobThatReadersRefuse) {
  TempDir dir;
  const auto path = dir / "p.kiln";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // a process that dies while streaming a 4 MiB tensor
    PackageWriter writer(path);
    writer.writeExecutable("exe", patternBytes(100));
    BlobWriter blob = writer.beginTensorData("w", {DType::kU8, {4 << 20}});
    blob.write(patternBytes(3 << 20));
    _exit(0);  // no destructor, no close
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_FALSE(std::filesystem::exists(path));
  const auto partial = fileBeingWritten(dir.path());
  try {
    const PackageReader reader(partial);
    FAIL() << "the reader accepted an incomplete blob";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("incomplete blob (total size 0)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(PackageWriter(partial, PackageWriter::Mode::kAppend), FormatError);
}

// A package rewritten while a reader has it mapped: the old file was
// truncated in place and the reader died of SIGBUS touching its pages
// (issue 12). Now the new package replaces the path by rename and the
// reader keeps reading the old one.
TEST(Writer, ReplacingAPackageLeavesItsReadersIntact) {
  TempDir dir;
  const auto path = dir / "p.kiln";
  const std::vector<std::byte> weights = patternBytes(4 << 20, 3);
  {
    PackageWriter writer(path);
    writer.writeTensorData("w", {DType::kU8, {4 << 20}}, weights);
    writer.close();
  }
  const PackageReader old_reader(path);
  const TensorDataBlob* old_weights = old_reader.findTensorData("w");
  ASSERT_NE(old_weights, nullptr);
  {
    PackageWriter writer(path);
    writer.writeExecutable("exe", patternBytes(10));
    writer.close();
  }
  const std::span<const std::byte> mapped = old_weights->data();
  EXPECT_TRUE(std::equal(mapped.begin(), mapped.end(), weights.begin(), weights.end()));
  const PackageReader new_reader(path);
  EXPECT_EQ(new_reader.findTensorData("w"), nullptr);
  EXPECT_NE(new_reader.findExecutable("exe"), nullptr);
}

// A writer unwound by an exception, or whose close() fails, leaves the
// path as it was and nothing beside it.
TEST(Writer, AnAbandonedWriterLeavesThePathAsItWas) {
  TempDir dir;
  const auto path = dir / "p.kiln";
  testing::writeSmallPackage(path);
  const auto before = testing::readFile(path);
  try {
    PackageWriter writer(path);
    writer.writeExecutable("exe", patternBytes(10));
    throw std::runtime_error("the compile failed");
  } catch (const std::runtime_error&) {
  }
  {
    PackageWriter writer(path);
    BlobWriter blob = writer.beginTensorData("short", {DType::kU8, {10}});
    blob.write(patternBytes(4));
    EXPECT_THROW(writer.close(), UsageError);
  }
  EXPECT_EQ(testing::readFile(path), before);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 1);
}

TEST(Writer, LayoutInvariantsHold) {
  TempDir dir;
  testing::writeSmallPackage(dir / "p.kiln");
  const auto bytes = testing::readFile(dir / "p.kiln");
  EXPECT_EQ(bytes.size() % 64, 0u);
  for (uint64_t offset : testing::blobOffsets(bytes)) {
    EXPECT_EQ(offset % 64, 0u);
    EXPECT_EQ(testing::peek<uint64_t>(bytes, offset + 32) % 64, 0u);  // payload offset
  }
}

}  // namespace
}  // namespace kiln

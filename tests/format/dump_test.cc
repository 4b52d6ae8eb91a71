#include "kiln/dump.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kiln/version.h"
#include "tests/format/test_package.h"

namespace kiln {
namespace {

using testing::bytesOf;
using testing::patternBytes;

class Dump : public ::testing::Test {
 protected:
  void SetUp() override {
    Metadata m = testing::makeMetadata("exe");
    m.replication_factor = 2;
    m.anchors[0].is_per_replica = true;
    m.anchors.push_back(testing::makeAnchor("samples", AnchorDirection::kInput, {DType::kU8, {3}}, {1}));
    m.anchors.push_back(testing::makeAnchor("w", AnchorDirection::kOutput, {DType::kF32, {2, 3}}, {2}));
    PackageWriter writer(dir_ / "p.kiln");
    writer.writeExecutable("exe", patternBytes(4000), /*compress=*/true);
    writer.writeMetadata("model", m);
    writer.writeTensorData("w", {DType::kF32, {2, 3}}, patternBytes(24));
    writer.writeFeedData("samples", {DType::kU8, {3}}, 4, patternBytes(12));
    writer.writeOpaque("framework", "exe", bytesOf(std::string("{}")));
    writer.close();
    reader_ = std::make_unique<PackageReader>(dir_ / "p.kiln");
  }

  testing::TempDir dir_;
  std::unique_ptr<PackageReader> reader_;
};

TEST_F(Dump, AllShowsEveryField) {
  const std::string text = dumpText(*reader_, DumpOptions::all());
  for (const char* expected : {
           "Blobs:", "Metadata:", "Name: \"model\":", "Executable: exe", "Device: cpu", "NumDevices: 1",
           "Features: [avx2]", "Replication Factor: 2", "IsInference: True", "threads: 2", "load: [0]",
           "main: [1]", "save: [2]", "0: load", "Anchors of \"model\":", "Inputs (User provided):",
           "Inputs (Package provided):", "Outputs (User provided):", "Outputs (Package provided):",
           "TensorInfo: { dtype: F32, sizeInBytes: 48, shape [4, 3] }",
           "EffectiveTensorInfo: { dtype: F32, sizeInBytes: 96, shape [2, 4, 3] }", "Handle: h2d_x",
           "IsPerReplica: True", "UseRemoteBuffers: False", "Repeats: 1", "BatchDim: 0", "BatchDim: none",
           "Programs: [1]", "Executables:", "Is compressed: True", "Available read size: 4000", "Stored size:",
           "Checksum: xxh3:", "Producer: kiln " KILN_VERSION, "Version: 1.0", "Tensors:", "Feeds:", "Count: 4",
           "Opaques:", "Name: \"framework\":", "Executable: exe", "Payload offset:", "Total size:", "Location: "}) {
    EXPECT_NE(text.find(expected), std::string::npos) << "missing: " << expected << "\n" << text;
  }
}

TEST_F(Dump, AnchorsAreSplitByDirectionAndProvider) {
  DumpOptions options;
  options.anchors = true;
  const std::string text = dumpText(*reader_, options);
  const auto section = [&](const std::string& heading) {
    const size_t start = text.find(heading);
    const size_t end = text.find("provided):", start + heading.size());
    return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
  };
  EXPECT_NE(section("Inputs (User provided):").find("\"x\""), std::string::npos);
  EXPECT_EQ(section("Inputs (User provided):").find("\"w\""), std::string::npos);
  EXPECT_NE(section("Inputs (Package provided):").find("\"w\""), std::string::npos);
  EXPECT_NE(section("Inputs (Package provided):").find("\"samples\""), std::string::npos);
  EXPECT_NE(section("Outputs (User provided):").find("\"y\""), std::string::npos);
  EXPECT_NE(section("Outputs (Package provided):").find("\"w\""), std::string::npos);

  DumpOptions user;
  user.user_anchors = true;
  const std::string all_text = dumpText(*reader_, user);
  const std::string user_text = all_text.substr(all_text.find("Anchors of"));
  EXPECT_EQ(user_text.find("Package provided"), std::string::npos);
  EXPECT_NE(user_text.find("\"x\""), std::string::npos);
  EXPECT_EQ(user_text.find("\"samples\""), std::string::npos);
}

TEST_F(Dump, JsonIsValidAndComplete) {
  const auto json = nlohmann::json::parse(dumpJson(*reader_, DumpOptions::all()));
  EXPECT_EQ(json["format_version"], "1.0");
  EXPECT_EQ(json["blobs"].size(), 5u);
  EXPECT_EQ(json["metadata"][0]["replication_factor"], 2);
  EXPECT_EQ(json["metadata"][0]["programs"]["2"], "save");
  EXPECT_EQ(json["executables"][0]["compressed"], true);
  EXPECT_EQ(json["executables"][0]["raw_size"], 4000);
  EXPECT_EQ(json["feeds"][0]["count"], 4);
  EXPECT_EQ(json["tensors"][0]["tensor_info"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(json["opaques"][0]["executable"], "exe");
  size_t user = 0;
  for (const auto& anchor : json["anchors"]) user += anchor["provided_by"] == "user";
  EXPECT_EQ(user, 2u);  // x and y
  EXPECT_EQ(json["anchors"][0]["effective_tensor_info"]["shape"], nlohmann::json({2, 4, 3}));
  EXPECT_TRUE(json["anchors"][1]["batch_dim"].is_null());
}

TEST_F(Dump, ColourOnlyWhenAsked) {
  EXPECT_EQ(dumpText(*reader_, DumpOptions::all()).find('\033'), std::string::npos);
  DumpOptions color = DumpOptions::all();
  color.color = true;
  EXPECT_NE(dumpText(*reader_, color).find("\033[1;36m"), std::string::npos);
}

TEST(DumpEscaping, ControlBytesInNamesAreShownEscaped) {
  testing::TempDir dir;
  {
    PackageWriter writer(dir / "p.kiln");
    writer.writeOpaque("evil\033[2Jname", "", {});
  }
  const PackageReader reader(dir / "p.kiln");
  DumpOptions options;
  options.opaques = true;
  const std::string text = dumpText(reader, options);
  EXPECT_EQ(text.find('\033'), std::string::npos);
  EXPECT_NE(text.find("evil\\x1b[2Jname"), std::string::npos) << text;
}

}  // namespace
}  // namespace kiln

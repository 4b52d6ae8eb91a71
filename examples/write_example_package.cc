// Writes a package that holds one blob of every type, the way the reference
// tool's example describes a model computing
//
//     Add:0 = user_input + input_parameter
//
// where user_input comes from the user, input_parameter is a weight stored
// in the package (TensorData), "images" is a set of sample inputs stored in
// the package (FeedData), and the "kiln-example" Opaque blob carries
// framework data linked to the executable.
//
// The Executable's payload is whatever the compiler produced; until the
// compiler exists this example stores the program's source text, compressed.
//
// Usage: write_example_package OUT.kiln [DATA.kiln]
//   With DATA.kiln, the TensorData and FeedData blobs go into that second
//   file: one model over two files, read together by `kiln dump OUT DATA`.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "kiln/format.h"

namespace {

std::span<const std::byte> bytesOf(const std::string& text) { return std::as_bytes(std::span(text.data(), text.size())); }

template <typename T>
std::span<const std::byte> bytesOf(const std::vector<T>& values) {
  return std::as_bytes(std::span(values.data(), values.size()));
}

kiln::Anchor anchor(std::string name, std::string handle, std::vector<uint32_t> programs, kiln::AnchorDirection direction,
                    bool per_replica) {
  kiln::Anchor a;
  a.name = std::move(name);
  a.handle = std::move(handle);
  a.programs = std::move(programs);
  a.info = {kiln::DType::kF32, {2}};
  a.direction = direction;
  a.is_per_replica = per_replica;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s OUT.kiln [DATA.kiln]\n", argv[0]);
    return 2;
  }
  using kiln::AnchorDirection;
  try {
    kiln::PackageWriter writer(argv[1]);

    std::string program;
    for (int i = 0; i < 64; ++i) program += "step " + std::to_string(i) + ": Add(user_input, input_parameter) -> Add:0\n";
    writer.writeExecutable("example-add", bytesOf(program), /*compress=*/true);

    kiln::Metadata metadata;
    metadata.executable = "example-add";
    metadata.target = {"cpu", 1, {"avx2"}};
    metadata.replication_factor = 1;
    metadata.is_inference = true;
    metadata.options = {{"memory.plan", "greedy-by-size"}, {"threads", "2"}};
    metadata.programs = {{0, "WeightsFromHost"}, {1, "Program"}, {2, "WeightsToHost"}};
    metadata.program_flow = {.load = {0}, .main = {1}, .save = {2}};
    metadata.anchors = {
        anchor("user_input", "h2d_user_input", {1}, AnchorDirection::kInput, true),
        anchor("input_parameter", "h2d_input_parameter", {0}, AnchorDirection::kInput, false),
        anchor("images", "h2d_images", {1}, AnchorDirection::kInput, true),
        anchor("Add:0", "d2h_Add:0", {1}, AnchorDirection::kOutput, true),
        anchor("input_parameter", "d2h_input_parameter", {2}, AnchorDirection::kOutput, false),
    };
    metadata.anchors[0].batch_dim = 0;
    writer.writeMetadata("example", metadata);

    std::optional<kiln::PackageWriter> data_file;
    if (argc == 3) data_file.emplace(argv[2]);
    kiln::PackageWriter& data_writer = data_file ? *data_file : writer;

    const std::vector<float> parameter = {0.5f, -1.25f};
    data_writer.writeTensorData("input_parameter", {kiln::DType::kF32, {2}}, bytesOf(parameter));

    // Four samples streamed one at a time, as a large feed would be.
    kiln::BlobWriter feed = data_writer.beginFeedData("images", {kiln::DType::kF32, {2}}, 4);
    for (int i = 0; i < 4; ++i) {
      const std::vector<float> sample = {static_cast<float>(i), static_cast<float>(10 * i)};
      feed.write(bytesOf(sample));
    }
    feed.close();

    writer.writeOpaque("kiln-example", "example-add", bytesOf(std::string(R"({"framework": "example", "opset": 17})")));
    writer.close();
    if (data_file) data_file->close();
    std::printf("wrote %s%s%s\n", argv[1], argc == 3 ? " and " : "", argc == 3 ? argv[2] : "");
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

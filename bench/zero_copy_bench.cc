// Zero-copy benchmark: what does opening a package with a large TensorData
// cost, beside reading the whole file into memory?
//
// Writes a package holding one TensorData of --size-mib MiB (default 1024),
// then measures, each case in a fresh child process so that resident memory
// starts clean, with the file's pages first evicted from the page cache
// ("cold") and then with them cached ("warm"):
//
//   open           PackageReader constructed (headers walked, nothing read)
//   open+element   the same, then one element read through the zero-copy span
//                  (ChecksumPolicy::kSkip: no payload verification)
//   open+verified  the same with the default policy: first access verifies
//                  the whole payload's checksum, so all of it is read
//   read file      the whole file read into a heap buffer, one element read
//
// Prints a Markdown table with time and resident-memory growth, and the
// ratio of each case to "read file".
//
// Usage: zero_copy_bench [--size-mib N] [--dir DIR]
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "kiln/format.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Sample {
  double seconds = 0;
  double rss_growth_mib = 0;
  float element = 0;
};

double residentMib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

void evictFromPageCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Each case calls `done(element)` once its work is finished, while what it
// holds (mapping, buffer) is still alive, so that the resident memory it
// costs is measured.
using Done = std::function<void(float element)>;

void readViaKiln(const std::string& path, kiln::ChecksumPolicy policy, bool touch, const Done& done) {
  const kiln::PackageReader reader(path, {.checksums = policy});
  const kiln::TensorDataBlob* blob = reader.findTensorData("weights");
  if (!touch) return done(blob == nullptr ? -1.0f : 0.0f);
  const auto data = blob->data();
  float value;
  std::memcpy(&value, data.data() + data.size() / 2, sizeof value);
  done(value);
}

void readWholeFile(const std::string& path, uint64_t tensor_offset_in_file, uint64_t tensor_size, const Done& done) {
  std::vector<char> buffer;
  {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    buffer.resize(static_cast<size_t>(in.tellg()));
    in.seekg(0);
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
  }
  float value;
  std::memcpy(&value, buffer.data() + tensor_offset_in_file + tensor_size / 2, sizeof value);
  done(value);
}

// Runs `work` in a child process and returns its measurements.
Sample measureInChild(const std::function<void(const Done&)>& work) {
  int fds[2];
  if (::pipe(fds) != 0) std::abort();
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    Sample sample;
    const double rss_before = residentMib();
    const auto start = Clock::now();
    work([&](float element) {
      sample.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      sample.rss_growth_mib = residentMib() - rss_before;
      sample.element = element;
    });
    if (::write(fds[1], &sample, sizeof sample) != sizeof sample) ::_exit(1);
    ::_exit(0);
  }
  ::close(fds[1]);
  Sample sample;
  if (::read(fds[0], &sample, sizeof sample) != sizeof sample) std::abort();
  ::close(fds[0]);
  ::waitpid(child, nullptr, 0);
  return sample;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t size_mib = 1024;
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--size-mib") size_mib = std::stoull(argv[i + 1]);
    if (std::string(argv[i]) == "--dir") dir = argv[i + 1];
  }
  const std::string path = dir + "/zero_copy_bench.kiln";
  const uint64_t elements = size_mib * 1024 * 1024 / sizeof(float);

  std::fprintf(stderr, "writing %llu MiB package to %s ...\n", static_cast<unsigned long long>(size_mib), path.c_str());
  {
    kiln::PackageWriter writer(path);
    kiln::BlobWriter blob = writer.beginTensorData("weights", {kiln::DType::kF32, {static_cast<int64_t>(elements)}});
    std::vector<float> chunk(1 << 20);
    for (uint64_t done = 0; done < elements; done += chunk.size()) {
      for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<float>((done + i) % 1000003);
      blob.write(chunk.data(), std::min<uint64_t>(chunk.size(), elements - done) * sizeof(float));
    }
    writer.close();
  }
  uint64_t payload_in_file = 0;
  {
    const kiln::PackageReader reader(path);
    const auto& info = reader.findTensorData("weights")->info();
    payload_in_file = info.offset + info.payload_offset;
  }
  const float expected = static_cast<float>((elements / 2) % 1000003);
  const uint64_t tensor_bytes = elements * sizeof(float);

  struct Case {
    const char* name;
    std::function<void(const Done&)> work;
  };
  const std::vector<Case> cases = {
      {"open", [&](const Done& done) { readViaKiln(path, kiln::ChecksumPolicy::kOnFirstAccess, false, done); }},
      {"open+element", [&](const Done& done) { readViaKiln(path, kiln::ChecksumPolicy::kSkip, true, done); }},
      {"open+verified element",
       [&](const Done& done) { readViaKiln(path, kiln::ChecksumPolicy::kOnFirstAccess, true, done); }},
      {"read file+element", [&](const Done& done) { readWholeFile(path, payload_in_file, tensor_bytes, done); }},
  };

  std::printf("TensorData of %llu MiB; each case in a fresh process; RSS = growth of VmRSS.\n\n",
              static_cast<unsigned long long>(size_mib));
  std::printf("| cache | case | time (ms) | RSS growth (MiB) | time vs read file | RSS vs read file |\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  bool all_correct = true;
  for (const bool cold : {true, false}) {
    if (!cold) (void)measureInChild(cases.back().work);  // brings the file into the page cache
    std::vector<Sample> samples;
    for (const Case& c : cases) {
      if (cold) evictFromPageCache(path);
      samples.push_back(measureInChild(c.work));
    }
    const Sample& baseline = samples.back();
    for (size_t i = 0; i < cases.size(); ++i) {
      const Sample& s = samples[i];
      if (i != 0 && s.element != expected) all_correct = false;
      std::printf("| %s | %s | %.3f | %.2f | %.4f%% | %.4f%% |\n", cold ? "cold" : "warm", cases[i].name,
                  s.seconds * 1e3, s.rss_growth_mib, 100.0 * s.seconds / baseline.seconds,
                  100.0 * s.rss_growth_mib / baseline.rss_growth_mib);
    }
  }
  std::remove(path.c_str());
  if (!all_correct) {
    std::fprintf(stderr, "error: an element read back differs from the one written\n");
    return 1;
  }
  return 0;
}

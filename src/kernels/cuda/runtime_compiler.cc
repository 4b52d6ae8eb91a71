#include "kernels/cuda/runtime_compiler.h"

#include <fmt/format.h>
#include <nvrtc.h>

#include "core/log.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

namespace kiln::cuda {
namespace {

struct Library {
  cudaLibrary_t library = nullptr;
  std::map<std::string, cudaKernel_t, std::less<>> kernels;
};

std::mutex& cacheMutex() {
  static std::mutex mutex;
  return mutex;
}

// Keyed by "<capability>\n<source>". Leaked on purpose: libraries may be in
// use by CUDA graphs until the process ends, and the CUDA runtime may
// already be torn down when static destructors run.
std::map<std::string, Library, std::less<>>& cache() {
  static auto* libraries = new std::map<std::string, Library, std::less<>>();
  return *libraries;
}

// The architecture option: real machine code (sm_XY) when this NVRTC knows
// the GPU, else PTX of the newest virtual architecture it knows below it,
// which the driver compiles at load. Empty when it knows none.
std::string architectureFor(int capability, bool* cubin) {
  int count = 0;
  if (nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0) return {};
  std::vector<int> archs(static_cast<size_t>(count));
  if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) return {};
  int best = 0;
  for (int arch : archs) {
    if (arch == capability) {
      *cubin = true;
      return fmt::format("--gpu-architecture=sm_{}", capability);
    }
    if (arch < capability && arch > best) best = arch;
  }
  *cubin = false;
  return best == 0 ? std::string() : fmt::format("--gpu-architecture=compute_{}", best);
}

}  // namespace

std::string compileImage(const std::string& source, int capability, std::string* error) {
  bool cubin = false;
  const std::string arch = architectureFor(capability, &cubin);
  if (arch.empty()) {
    *error = fmt::format("this NVRTC knows no architecture for compute capability {}", capability);
    return {};
  }
  nvrtcProgram program = nullptr;
  if (nvrtcCreateProgram(&program, source.c_str(), "kiln_generated.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) {
    *error = "nvrtcCreateProgram failed";
    return {};
  }
  const char* options[] = {arch.c_str(), "--std=c++17", "--extra-device-vectorization"};
  const nvrtcResult compiled = nvrtcCompileProgram(program, static_cast<int>(std::size(options)), options);
  std::string image;
  if (compiled != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(program, &log_size);
    std::string log(log_size, '\0');
    if (log_size > 0) nvrtcGetProgramLog(program, log.data());
    *error = fmt::format("NVRTC: {}: {}", nvrtcGetErrorString(compiled), log);
  } else {
    size_t size = 0;
    const nvrtcResult sized = cubin ? nvrtcGetCUBINSize(program, &size) : nvrtcGetPTXSize(program, &size);
    image.resize(size);
    const nvrtcResult got = sized != NVRTC_SUCCESS ? sized
                            : cubin                ? nvrtcGetCUBIN(program, image.data())
                                                   : nvrtcGetPTX(program, image.data());
    if (got != NVRTC_SUCCESS) {
      *error = fmt::format("NVRTC: {}", nvrtcGetErrorString(got));
      image.clear();
    }
  }
  nvrtcDestroyProgram(&program);
  return image;
}

bool runtimeCompilerEnabled() {
  const char* value = std::getenv("KILN_CUDA_JIT");
  return value == nullptr || std::string_view(value) != "0";
}

namespace {

// The first failure of the process, logged: steps then run on the slower
// built-in kernels.
void warnOnce(const std::string& error) {
  static std::once_flag warned;
  std::call_once(warned, [&] {
    log::warning("cuda: the runtime compiler failed (such steps run on the slower built-in kernels): {}", error);
  });
}

std::vector<cudaKernel_t> compileAndLoad(const std::string& source, std::span<const char* const> names,
                                         int compute_capability, std::string* error) {
  const std::string key = fmt::format("{}\n{}", compute_capability, source);
  std::lock_guard lock(cacheMutex());
  auto found = cache().find(key);
  if (found == cache().end()) {
    const std::string image = compileImage(source, compute_capability, error);
    if (image.empty()) return {};
    Library library;
    const cudaError_t loaded =
        cudaLibraryLoadData(&library.library, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (loaded != cudaSuccess) {
      cudaGetLastError();
      *error = fmt::format("cudaLibraryLoadData: {}", cudaGetErrorString(loaded));
      return {};
    }
    found = cache().emplace(key, std::move(library)).first;
  }
  std::vector<cudaKernel_t> kernels;
  for (const char* name : names) {
    auto known = found->second.kernels.find(name);
    if (known == found->second.kernels.end()) {
      cudaKernel_t kernel = nullptr;
      const cudaError_t got = cudaLibraryGetKernel(&kernel, found->second.library, name);
      if (got != cudaSuccess) {
        cudaGetLastError();
        *error = fmt::format("cudaLibraryGetKernel({}): {}", name, cudaGetErrorString(got));
        return {};
      }
      known = found->second.kernels.emplace(name, kernel).first;
    }
    kernels.push_back(known->second);
  }
  return kernels;
}

}  // namespace

std::vector<cudaKernel_t> compileKernels(const std::string& source, std::span<const char* const> names,
                                         int compute_capability, std::string* error) {
  std::vector<cudaKernel_t> kernels = compileAndLoad(source, names, compute_capability, error);
  if (kernels.empty()) warnOnce(*error);
  return kernels;
}

}  // namespace kiln::cuda

// cuBLAS, cuBLASLt and NVRTC, loaded on first use.
//
// Why: linking these libraries costs every kiln process about 180 MiB of
// resident memory at start (cuBLASLt's relocations and static tables alone
// are ~150 MiB; NVRTC ~30 MiB), GPU or not. Most kiln processes run on the
// CPU and never call them. So the build does not link them: this file
// defines the functions kiln calls, and the first call of each library's
// functions dlopens the library and resolves the real one (cuDNN stays
// linked: it loads its engines lazily itself and costs ~1.5 MiB).
//
// A library that cannot be loaded makes its functions return an error
// status (CUBLAS_STATUS_NOT_INITIALIZED, NVRTC_ERROR_INTERNAL_ERROR) that
// the callers already turn into clear errors; the loader's reason is
// logged once. The list below is every cuBLAS/cuBLASLt/NVRTC function kiln
// uses: a new call to one not listed fails to link, on purpose.
//
// Thread safety: each library loads once (std::call_once); each function's
// address is resolved once (a function-local static).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <mutex>
#include <string>

#include "core/log.h"

namespace kiln::cuda {
namespace {

class LazyLibrary {
 public:
  // `soname`: the name the dynamic loader knows (its cache, LD_LIBRARY_PATH);
  // `fallback`: the path the build found it at, tried second.
  LazyLibrary(const char* soname, const char* fallback) : soname_(soname), fallback_(fallback) {}

  // The address of `symbol`, or null (logged once) when the library or the
  // symbol is missing.
  void* find(const char* symbol) {
    std::call_once(once_, [this] { load(); });
    if (handle_ == nullptr) return nullptr;
    void* address = dlsym(handle_, symbol);
    if (address == nullptr) log::warning("{} has no {}: {}", soname_, symbol, dlerror());
    return address;
  }

 private:
  void load() {
    handle_ = dlopen(soname_, RTLD_NOW | RTLD_LOCAL);
    if (handle_ != nullptr) return;
    const std::string first = dlerror();
    handle_ = dlopen(fallback_, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      log::warning("cannot load {} (needed by the cuda device): {}; {}", soname_, first, dlerror());
    }
  }

  const char* soname_;
  const char* fallback_;
  std::once_flag once_;
  void* handle_ = nullptr;
};

#define KILN_LIBRARY_PATH(name) KILN_CUDA_LIBRARY_DIR "/" name

LazyLibrary& cublas() {
  static LazyLibrary library("libcublas.so." KILN_CUDA_MAJOR, KILN_LIBRARY_PATH("libcublas.so." KILN_CUDA_MAJOR));
  return library;
}
LazyLibrary& cublasLt() {
  static LazyLibrary library("libcublasLt.so." KILN_CUDA_MAJOR,
                             KILN_LIBRARY_PATH("libcublasLt.so." KILN_CUDA_MAJOR));
  return library;
}
LazyLibrary& nvrtc() {
  static LazyLibrary library("libnvrtc.so." KILN_CUDA_MAJOR, KILN_LIBRARY_PATH("libnvrtc.so." KILN_CUDA_MAJOR));
  return library;
}

}  // namespace
}  // namespace kiln::cuda

// Defines `name` (declared by the library's header) as a call of the real
// function of `library`, or `failure` when it cannot be resolved.
#define KILN_FORWARD(library, failure, result, name, params, args)                                    \
  result name params {                                                                                \
    using Real = result(*) params;                                                                    \
    static const auto real = reinterpret_cast<Real>(kiln::cuda::library().find(#name));             \
    if (real == nullptr) return failure;                                                              \
    return real args;                                                                                 \
  }

extern "C" {

// --- cuBLAS -----------------------------------------------------------------
#define KILN_CUBLAS(name, params, args) \
  KILN_FORWARD(cublas, CUBLAS_STATUS_NOT_INITIALIZED, cublasStatus_t, name, params, args)

KILN_CUBLAS(cublasCreate_v2, (cublasHandle_t * handle), (handle))
KILN_CUBLAS(cublasDestroy_v2, (cublasHandle_t handle), (handle))
KILN_CUBLAS(cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode), (handle, mode))
KILN_CUBLAS(cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
KILN_CUBLAS(cublasSetWorkspace_v2, (cublasHandle_t handle, void* workspace, size_t bytes), (handle, workspace, bytes))
KILN_CUBLAS(cublasGemmStridedBatchedEx,
            (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
             const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA, const void* B,
             cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C, cudaDataType Ctype,
             int ldc, long long int strideC, int batchCount, cublasComputeType_t computeType,
             cublasGemmAlgo_t algo),
            (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype,
             ldc, strideC, batchCount, computeType, algo))
KILN_FORWARD(cublas, "cuBLAS could not be loaded", const char*, cublasGetStatusName, (cublasStatus_t status),
             (status))
KILN_FORWARD(cublas, "cuBLAS could not be loaded", const char*, cublasGetStatusString, (cublasStatus_t status),
             (status))

// --- cuBLASLt ---------------------------------------------------------------
#define KILN_CUBLASLT(name, params, args) \
  KILN_FORWARD(cublasLt, CUBLAS_STATUS_NOT_INITIALIZED, cublasStatus_t, name, params, args)

KILN_CUBLASLT(cublasLtCreate, (cublasLtHandle_t * handle), (handle))
KILN_CUBLASLT(cublasLtDestroy, (cublasLtHandle_t handle), (handle))
KILN_CUBLASLT(cublasLtMatmul,
              (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
               cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
               const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
               const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceBytes, cudaStream_t stream),
              (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, workspaceBytes,
               stream))
KILN_CUBLASLT(cublasLtMatmulAlgoGetHeuristic,
              (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
               cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
               cublasLtMatmulPreference_t preference, int requested, cublasLtMatmulHeuristicResult_t results[],
               int* returned),
              (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requested, results, returned))
KILN_CUBLASLT(cublasLtMatmulDescCreate,
              (cublasLtMatmulDesc_t * desc, cublasComputeType_t computeType, cudaDataType_t scaleType),
              (desc, computeType, scaleType))
KILN_CUBLASLT(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
KILN_CUBLASLT(cublasLtMatmulDescSetAttribute,
              (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t bytes),
              (desc, attr, buf, bytes))
KILN_CUBLASLT(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
KILN_CUBLASLT(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
KILN_CUBLASLT(cublasLtMatmulPreferenceSetAttribute,
              (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
               size_t bytes),
              (pref, attr, buf, bytes))
KILN_CUBLASLT(cublasLtMatrixLayoutCreate,
              (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
              (layout, type, rows, cols, ld))
KILN_CUBLASLT(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
KILN_CUBLASLT(cublasLtMatrixLayoutSetAttribute,
              (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t bytes),
              (layout, attr, buf, bytes))

// --- NVRTC ------------------------------------------------------------------
#define KILN_NVRTC(name, params, args) KILN_FORWARD(nvrtc, NVRTC_ERROR_INTERNAL_ERROR, nvrtcResult, name, params, args)

KILN_NVRTC(nvrtcCreateProgram,
           (nvrtcProgram * prog, const char* src, const char* name, int numHeaders, const char* const* headers,
            const char* const* includeNames),
           (prog, src, name, numHeaders, headers, includeNames))
KILN_NVRTC(nvrtcCompileProgram, (nvrtcProgram prog, int numOptions, const char* const* options),
           (prog, numOptions, options))
KILN_NVRTC(nvrtcDestroyProgram, (nvrtcProgram * prog), (prog))
KILN_NVRTC(nvrtcGetCUBIN, (nvrtcProgram prog, char* cubin), (prog, cubin))
KILN_NVRTC(nvrtcGetCUBINSize, (nvrtcProgram prog, size_t* bytes), (prog, bytes))
KILN_NVRTC(nvrtcGetPTX, (nvrtcProgram prog, char* ptx), (prog, ptx))
KILN_NVRTC(nvrtcGetPTXSize, (nvrtcProgram prog, size_t* bytes), (prog, bytes))
KILN_NVRTC(nvrtcGetProgramLog, (nvrtcProgram prog, char* log), (prog, log))
KILN_NVRTC(nvrtcGetProgramLogSize, (nvrtcProgram prog, size_t* bytes), (prog, bytes))
KILN_NVRTC(nvrtcGetNumSupportedArchs, (int* count), (count))
KILN_NVRTC(nvrtcGetSupportedArchs, (int* archs), (archs))
KILN_FORWARD(nvrtc, "NVRTC could not be loaded", const char*, nvrtcGetErrorString, (nvrtcResult result), (result))

}  // extern "C"

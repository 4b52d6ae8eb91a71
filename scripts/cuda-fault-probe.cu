// Can a process use its GPU again after an illegal address? Four children
// each fault a context (a kernel writing through a wild pointer) or not,
// reset the device one way or another, and poll for a new context for
// 10 s; then the parent, a process that never faulted, tries. On an H200
// with driver 580 (2026-11-26): a plain reset gives a context at once; after
// a fault, cudaDeviceReset and cuDevicePrimaryCtxReset both leave every new
// context refused (cudaErrorDevicesUnavailable) for the 10 s; the parent
// gets one at once. Why kiln's cuda device gives such errors the recovery
// action "restart the process" (docs/cuda.md, "Errors").
//
//   nvcc -o /tmp/cuda-fault-probe scripts/cuda-fault-probe.cu -lcuda && /tmp/cuda-fault-probe
//
// CUDA is first touched in the children (a forked child must not inherit
// an initialised CUDA).
#include <cuda_runtime.h>
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <thread>
#include <unistd.h>
#include <sys/wait.h>

__global__ void wild(float* p) { p[threadIdx.x] = 1.0f; }

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void poll(const char* what) {
  double t0 = now();
  for (int i = 0; i < 100; ++i) {
    cudaError_t s = cudaSetDevice(0);
    void* p = nullptr;
    if (s == cudaSuccess) s = cudaMalloc(&p, 1 << 20);
    if (s == cudaSuccess) {
      printf("  %s: usable after %.3f s (try %d)\n", what, now() - t0, i);
      cudaFree(p);
      return;
    }
    if (i < 3 || i % 20 == 0) printf("  %s: try %d: %s\n", what, i, cudaGetErrorName(s));
    cudaGetLastError();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  printf("  %s: still unusable after %.1f s\n", what, now() - t0);
}

static void fault() {
  cudaSetDevice(0);
  cudaFree(0);
  wild<<<1, 32>>>(reinterpret_cast<float*>(64));
  printf("  sync: %s\n", cudaGetErrorName(cudaDeviceSynchronize()));
}

int main() {
  for (int scenario = 0; scenario < 4; ++scenario) {
    pid_t child = fork();
    if (child == 0) {
      switch (scenario) {
        case 0:
          printf("A: plain reset, no fault\n");
          cudaSetDevice(0); cudaFree(0);
          printf("  reset: %s\n", cudaGetErrorName(cudaDeviceReset()));
          poll("A");
          break;
        case 1:
          printf("B: fault, cudaDeviceReset, poll\n");
          fault();
          printf("  reset: %s\n", cudaGetErrorName(cudaDeviceReset()));
          poll("B");
          break;
        case 2: {
          printf("C: fault, cuDevicePrimaryCtxReset, poll\n");
          fault();
          CUdevice d; cuDeviceGet(&d, 0);
          printf("  primary reset: %d\n", (int)cuDevicePrimaryCtxReset(d));
          poll("C");
          break;
        }
        case 3: {
          printf("D: fault, cudaDeviceReset twice with a pause\n");
          fault();
          printf("  reset: %s\n", cudaGetErrorName(cudaDeviceReset()));
          std::this_thread::sleep_for(std::chrono::seconds(1));
          printf("  reset again: %s\n", cudaGetErrorName(cudaDeviceReset()));
          poll("D");
          break;
        }
      }
      fflush(stdout);
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    fflush(stdout);
  }
  printf("parent after children:\n");
  poll("parent");
  int mode = -1;
  cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, 0);
  printf("compute mode %d (0 default, 2 prohibited, 3 exclusive process)\n", mode);
  return 0;
}

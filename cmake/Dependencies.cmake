# Every third-party library kiln builds against, in one place. The Debian
# packages that provide them are listed in scripts/packages.txt.
find_package(PkgConfig REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
if(KILN_BUILD_TESTS OR KILN_BUILD_FUZZERS)
  find_package(GTest REQUIRED)
endif()
if(KILN_BUILD_BENCH)
  find_package(benchmark REQUIRED)
  # Header-only: boost::lockfree::spsc_queue, the baseline of ring_buffer_bench.
  find_package(Boost REQUIRED)
endif()
find_package(Protobuf REQUIRED)
find_package(ONNX REQUIRED)
find_package(Threads REQUIRED)
# kiln serve's transports: gRPC (with protoc's gRPC plugin) and cpp-httplib.
if(KILN_BUILD_SERVER)
  find_package(gRPC CONFIG REQUIRED)
  pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
endif()
# Optional: the CPU kernels split large steps across OpenMP's threads, the
# pool oneDNN runs on (src/kernels/cpu/parallel.h); without it they run on
# the calling thread.
find_package(OpenMP COMPONENTS CXX)
find_package(dnnl CONFIG REQUIRED)

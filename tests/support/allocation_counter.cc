#include "tests/support/allocation_counter.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include <errno.h>  // program_invocation_short_name
#include <sys/prctl.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KILN_TEST_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define KILN_TEST_SANITIZER 1
#endif
#endif

#if defined(__GLIBC__) && !defined(KILN_TEST_SANITIZER)
#define KILN_TEST_COUNT_MALLOC 1
#endif

namespace {

std::atomic<bool> counting{false};
std::atomic<std::size_t> failing_from{0};  // failAllocationsOfAtLeast
std::atomic<uint64_t> news{0};
std::atomic<uint64_t> mallocs{0};

// The NVIDIA driver starts threads of its own ("cuda-EvtHandlr",
// "cuda00001400006") when a process first lists or uses a GPU, and they
// allocate on their own schedule. They are left out of the count, so that a
// machine with a GPU checks kiln's threads as a machine without one does.
// Decided once per thread, by the name the thread has the first time it
// allocates while counting; threads named after the program are never left
// out. (thread_local here is safe inside malloc: this file is linked into
// executables only, whose TLS needs no allocation.)
bool isCudaDriverThread() {
  thread_local int state = -1;  // -1 unknown, 0 no, 1 yes
  if (state < 0) {
    char name[16] = {};
    prctl(PR_GET_NAME, name);
    state = std::strncmp(name, "cuda", 4) == 0 &&
            std::strncmp(name, program_invocation_short_name, sizeof(name) - 1) != 0;
  }
  return state == 1;
}

bool countsThisThread() { return counting.load(std::memory_order_relaxed) && !isCudaDriverThread(); }

void countNew() {
  if (countsThisThread()) news.fetch_add(1, std::memory_order_relaxed);
}

void failIfAsked(std::size_t size) {
  const std::size_t from = failing_from.load(std::memory_order_relaxed);
  if (from != 0 && size >= from) throw std::bad_alloc();
}

void* allocate(std::size_t size) {
  failIfAsked(size);
  countNew();
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* allocateAligned(std::size_t size, std::align_val_t alignment) {
  failIfAsked(size);
  countNew();
  void* p = nullptr;
  const std::size_t align = std::max(static_cast<std::size_t>(alignment), sizeof(void*));
  if (posix_memalign(&p, align, size == 0 ? 1 : size) != 0) throw std::bad_alloc();
  return p;
}

}  // namespace

namespace kiln::testing {

bool countsMallocs() {
#ifdef KILN_TEST_COUNT_MALLOC
  return true;
#else
  return false;
#endif
}

void failAllocationsOfAtLeast(std::size_t bytes) { failing_from.store(bytes, std::memory_order_relaxed); }

void startCountingAllocations() {
  news.store(0);
  mallocs.store(0);
  counting.store(true);
}

AllocationCount stopCountingAllocations() {
  counting.store(false);
  return AllocationCount{news.load(), mallocs.load()};
}

}  // namespace kiln::testing

// Replacements of the global allocation functions (all of their forms, so
// that none escapes the count).
void* operator new(std::size_t size) { return allocate(size); }
void* operator new[](std::size_t size) { return allocate(size); }
void* operator new(std::size_t size, std::align_val_t alignment) { return allocateAligned(size, alignment); }
void* operator new[](std::size_t size, std::align_val_t alignment) { return allocateAligned(size, alignment); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return allocate(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return allocate(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  try {
    return allocateAligned(size, alignment);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  try {
    return allocateAligned(size, alignment);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

#ifdef KILN_TEST_COUNT_MALLOC
// glibc's malloc under its internal names; these definitions interpose the
// public ones for the whole process and forward to them.
extern "C" {
void* __libc_malloc(std::size_t size) noexcept;
void* __libc_calloc(std::size_t count, std::size_t size) noexcept;
void* __libc_realloc(void* p, std::size_t size) noexcept;
void* __libc_memalign(std::size_t alignment, std::size_t size) noexcept;
void __libc_free(void* p) noexcept;
}

namespace {
void countMalloc() {
  if (countsThisThread()) mallocs.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

extern "C" {

void* malloc(std::size_t size) noexcept {
  countMalloc();
  return __libc_malloc(size);
}
void* calloc(std::size_t count, std::size_t size) noexcept {
  countMalloc();
  return __libc_calloc(count, size);
}
void* realloc(void* p, std::size_t size) noexcept {
  countMalloc();
  return __libc_realloc(p, size);
}
void free(void* p) noexcept { __libc_free(p); }
int posix_memalign(void** p, std::size_t alignment, std::size_t size) noexcept {
  countMalloc();
  *p = __libc_memalign(alignment, size);
  return *p == nullptr ? ENOMEM : 0;
}
void* aligned_alloc(std::size_t alignment, std::size_t size) noexcept {
  countMalloc();
  return __libc_memalign(alignment, size);
}
void* memalign(std::size_t alignment, std::size_t size) noexcept {
  countMalloc();
  return __libc_memalign(alignment, size);
}
}
#endif

// RingBuffer benchmark: throughput of kiln::RingBuffer against
// boost::lockfree::spsc_queue, one producer thread and one consumer thread.
//
// Both queues carry the same 24-byte entry the QueueManager stores (a
// pointer to user memory, its size, a callback context), have the same
// capacity (runtime-sized, as kiln's is) and run in the same process one
// after the other, repetition by repetition, with the producer and the
// consumer pinned to two different cores. Both sides spin on full/empty
// (with the CPU's pause hint, nothing else): no batching, no back-off. The consumer checks that every entry arrives,
// in order, so that the work cannot be optimised away and a broken queue
// fails loudly. The best of --repetitions runs of each is reported.
//
// Usage: ring_buffer_bench [--items N] [--repetitions R]
// Prints one line per capacity:
//   ring_buffer capacity=1024: kiln 312.4 M items/s, boost 201.3 M items/s, ratio 1.55
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <boost/lockfree/spsc_queue.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kiln/ring_buffer.h"

namespace {

using Clock = std::chrono::steady_clock;

// What the QueueManager will store per queued tensor.
struct Entry {
  void* data = nullptr;
  uint64_t bytes = 0;
  void* callback_context = nullptr;
};
static_assert(sizeof(Entry) == 24);

// The two queues behind one interface, so that the loops are the same code.
class KilnQueue {
 public:
  static constexpr const char* kName = "kiln";
  explicit KilnQueue(size_t capacity) : queue_(capacity) {}
  bool push(const Entry& entry) { return queue_.tryPush(entry); }
  bool pop(Entry& entry) { return queue_.tryPop(entry); }

 private:
  kiln::RingBuffer<Entry> queue_;
};

class BoostQueue {
 public:
  static constexpr const char* kName = "boost";
  explicit BoostQueue(size_t capacity) : queue_(capacity) {}
  bool push(const Entry& entry) { return queue_.push(entry); }
  bool pop(Entry& entry) { return queue_.pop(entry); }

 private:
  // Runtime-sized, like kiln's. Aligned to a cache line (kiln's RingBuffer
  // is), so that its padded indices do not share lines with the stack frame.
  alignas(64) boost::lockfree::spsc_queue<Entry> queue_;
};

// The cores the producer and the consumer run on; -1 when the process may
// use fewer than two (then nothing is pinned and the spinning sides yield,
// or a run would last as long as the scheduler's time slices allow).
struct Placement {
  int producer_cpu = -1;
  int consumer_cpu = -1;
  bool pinned() const { return producer_cpu >= 0; }
};

Placement choosePlacement() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return {};
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  if (cpus.size() < 2) return {};
  return {cpus[0], cpus[1]};
}

void pinCurrentThread(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int error = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (error != 0) {
    std::fprintf(stderr, "ring_buffer_bench: cannot pin to cpu %d: %s\n", cpu, std::strerror(error));
    std::exit(1);
  }
}

// One turn of a side's spin-wait on full/empty, the same for both queues:
// the CPU's spin-wait hint, which also keeps the waiting side from pulling
// the other side's index line back on every iteration.
inline void waitForOtherSide(bool yield) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
  if (yield) std::this_thread::yield();
}

// One run: the producer pushes `items` entries, the consumer pops them and
// checks their order. Returns items per second, from the moment both
// threads are released to the moment the consumer has the last entry.
template <typename Queue>
double runOnce(size_t capacity, uint64_t items, const Placement& placement) {
  Queue queue(capacity);
  const bool unpinned = !placement.pinned();
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  uint64_t out_of_order = 0;
  Clock::time_point start;
  Clock::time_point end;

  std::thread consumer([&] {
    pinCurrentThread(placement.consumer_cpu);
    ready.fetch_add(1);
    while (!go.load(std::memory_order_acquire)) {
    }
    // Locals, so that the loops touch no line of this frame that the other
    // thread reads or writes (the count is stored once at the end).
    const uint64_t count = items;
    const bool yield = unpinned;
    uint64_t errors = 0;
    Entry entry;
    for (uint64_t expected = 0; expected < count; ++expected) {
      while (!queue.pop(entry)) waitForOtherSide(yield);
      errors += entry.bytes != expected;
    }
    end = Clock::now();
    out_of_order = errors;
  });
  std::thread producer([&] {
    pinCurrentThread(placement.producer_cpu);
    ready.fetch_add(1);
    while (!go.load(std::memory_order_acquire)) {
    }
    const uint64_t count = items;
    const bool yield = unpinned;
    for (uint64_t i = 0; i < count; ++i) {
      const Entry entry{nullptr, i, &queue};
      while (!queue.push(entry)) waitForOtherSide(yield);
    }
  });
  while (ready.load() < 2) {
  }
  start = Clock::now();
  go.store(true, std::memory_order_release);
  producer.join();
  consumer.join();

  if (out_of_order != 0) {
    std::fprintf(stderr, "ring_buffer_bench: %s queue delivered %llu entries out of order\n", Queue::kName,
                 static_cast<unsigned long long>(out_of_order));
    std::exit(1);
  }
  return static_cast<double>(items) / std::chrono::duration<double>(end - start).count();
}

uint64_t parseCount(const char* flag, const char* value) {
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(value, &end, 10);
  if (end == value || *end != '\0' || parsed == 0) {
    std::fprintf(stderr, "ring_buffer_bench: %s needs a positive integer, not '%s'\n", flag, value);
    std::exit(2);
  }
  return parsed;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t items = 20'000'000;
  uint64_t repetitions = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if ((flag == "--items" || flag == "--repetitions") && i + 1 < argc) {
      (flag == "--items" ? items : repetitions) = parseCount(argv[i], argv[i + 1]);
      ++i;
    } else {
      std::fprintf(stderr, "usage: ring_buffer_bench [--items N] [--repetitions R]\n");
      return 2;
    }
  }

  const Placement placement = choosePlacement();
  if (placement.pinned()) {
    std::printf("producer on cpu %d, consumer on cpu %d; %llu items, best of %llu runs\n", placement.producer_cpu,
                placement.consumer_cpu, static_cast<unsigned long long>(items),
                static_cast<unsigned long long>(repetitions));
  } else {
    std::printf(
        "WARNING: fewer than 2 cores available: threads not pinned, spinning sides yield; "
        "figures are not representative\n");
  }

  for (const size_t capacity : {size_t{1024}, size_t{64}}) {
    double best_kiln = 0;
    double best_boost = 0;
    // Alternated, so that a slow spell of the machine hits both queues.
    for (uint64_t run = 0; run < repetitions; ++run) {
      best_kiln = std::max(best_kiln, runOnce<KilnQueue>(capacity, items, placement));
      best_boost = std::max(best_boost, runOnce<BoostQueue>(capacity, items, placement));
    }
    std::printf("ring_buffer capacity=%zu: kiln %.1f M items/s, boost %.1f M items/s, ratio %.2f\n", capacity,
                best_kiln / 1e6, best_boost / 1e6, best_kiln / best_boost);
    std::fflush(stdout);
  }
  return 0;
}

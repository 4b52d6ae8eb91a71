// RingBuffer benchmark: throughput of kiln::RingBuffer against the
// well-known single-producer single-consumer queues that Debian packages,
// boost::lockfree::spsc_queue and moodycamel's ReaderWriterQueue, one
// producer thread and one consumer thread.
//
// The queues carry the same 24-byte entry the QueueManager stores (a
// pointer to user memory, its size, a callback context), have the same
// capacity (runtime-sized, as kiln's is) and run in the same process one
// after the other, repetition by repetition, with the producer and the
// consumer pinned to two different cores. All sides spin on full/empty
// (with the CPU's pause hint, nothing else): no batching, no back-off. The
// consumer checks that every entry arrives, in order, so that the work
// cannot be optimised away and a broken queue fails loudly. Each queue's
// median of --repetitions runs is reported with its spread (min-max), and
// kiln's ratio to the best of the others' medians.
//
// Usage: ring_buffer_bench [--items N] [--repetitions R]
// Prints one line per capacity:
//   capacity=1024: kiln 312.4 (298.0-320.1), boost 201.3 (...), moodycamel 250.2 (...) M items/s; kiln / best other 1.25
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <boost/lockfree/spsc_queue.hpp>
#include <readerwriterqueue/readerwriterqueue.h>
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

class MoodycamelQueue {
 public:
  static constexpr const char* kName = "moodycamel";
  explicit MoodycamelQueue(size_t capacity) : queue_(capacity) {}
  // try_enqueue never allocates: it fails when the preallocated blocks are full.
  bool push(const Entry& entry) { return queue_.try_enqueue(entry); }
  bool pop(Entry& entry) { return queue_.try_dequeue(entry); }

 private:
  alignas(64) moodycamel::ReaderWriterQueue<Entry> queue_;
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
    std::printf("producer on cpu %d, consumer on cpu %d; %llu items, median of %llu runs\n", placement.producer_cpu,
                placement.consumer_cpu, static_cast<unsigned long long>(items),
                static_cast<unsigned long long>(repetitions));
  } else {
    std::printf(
        "WARNING: fewer than 2 cores available: threads not pinned, spinning sides yield; "
        "figures are not representative\n");
  }

  struct Spread {
    double median, low, high;
  };
  auto spread = [](std::vector<double> runs) {
    std::sort(runs.begin(), runs.end());
    return Spread{runs[runs.size() / 2], runs.front(), runs.back()};
  };
  for (const size_t capacity : {size_t{64}, size_t{1024}, size_t{16384}, size_t{1048576}}) {
    std::vector<double> kiln, boost, moodycamel;
    // Alternated, so that a slow spell of the machine hits every queue.
    for (uint64_t run = 0; run < repetitions; ++run) {
      kiln.push_back(runOnce<KilnQueue>(capacity, items, placement));
      boost.push_back(runOnce<BoostQueue>(capacity, items, placement));
      moodycamel.push_back(runOnce<MoodycamelQueue>(capacity, items, placement));
    }
    const Spread k = spread(kiln), b = spread(boost), m = spread(moodycamel);
    std::printf("capacity=%zu: kiln %.1f (%.1f-%.1f), boost %.1f (%.1f-%.1f), moodycamel %.1f (%.1f-%.1f) M items/s; "
                "kiln / best other %.2f\n",
                capacity, k.median / 1e6, k.low / 1e6, k.high / 1e6, b.median / 1e6, b.low / 1e6, b.high / 1e6,
                m.median / 1e6, m.low / 1e6, m.high / 1e6, k.median / std::max(b.median, m.median));
    std::fflush(stdout);
  }
  return 0;
}

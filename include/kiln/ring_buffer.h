// RingBuffer: a fixed-capacity, lock-free FIFO for exactly one producer
// thread and one consumer thread.
//
// The QueueManager keeps one per model input/output anchor; its entries
// point to user memory, so they are small values that are moved in and out,
// and every operation must be cheap: a push or a pop is one store into a
// slot plus one release store of an index, and touches the other side's
// cache line only when the buffer looks full (producer) or empty (consumer).
//
// Thread safety (one producer, one consumer):
//   producer side  tryPush(). Only one thread at a time may be the producer.
//   consumer side  front(), pop(), tryPop(). Only one thread at a time may
//                  be the consumer; the pointer front() returns is valid
//                  until that consumer's next pop().
//   either side    capacity() (exact), size(), empty(), full(): exact when
//                  the other side is idle, a recent value (between what it
//                  was before and after the call) while it runs.
// Calling a producer function from two threads at once, or a consumer
// function from two threads at once, is a data race. Handing a side over to
// another thread needs the caller's own synchronisation (a join, a mutex).
//
// Memory: the capacity is fixed at construction, where the only allocation
// happens (the slots, default-constructed). Nothing allocates afterwards.
// T must be default-constructible and nothrow move-assignable, so that a
// push or pop can neither fail half-way nor throw.
#pragma once

#include <atomic>
#include <bit>
#include <cassert>
#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "kiln/error.h"

namespace kiln {

template <typename T>
class RingBuffer {
  static_assert(std::is_default_constructible_v<T>, "RingBuffer<T>: T must be default-constructible");
  static_assert(std::is_nothrow_move_assignable_v<T>, "RingBuffer<T>: T must be nothrow move-assignable");

 public:
  // capacity >= 1: exactly this many items fit. Throws UsageError otherwise.
  explicit RingBuffer(size_t capacity)
      : capacity_(checkedCapacity(capacity)),
        mask_(std::bit_ceil(capacity) - 1),
        slots_(std::make_unique<T[]>(mask_ + 1)) {}

  RingBuffer(const RingBuffer&) = delete;
  RingBuffer& operator=(const RingBuffer&) = delete;

  size_t capacity() const { return capacity_; }

  // Producer: moves `item` into the buffer; false when it is full (then
  // `item`, taken by value, is simply destroyed).
  [[nodiscard]] bool tryPush(T item) {
    const size_t tail = producer_.tail;  // this side's copy of tail_
    if (tail - producer_.cached_head == capacity_) {
      // Looks full: see how far the consumer has got. Acquire pairs with the
      // consumer's release of head_, so its move out of the slot we are
      // about to overwrite has finished.
      producer_.cached_head = head_.load(std::memory_order_acquire);
      if (tail - producer_.cached_head == capacity_) return false;
    }
    slots_[tail & mask_] = std::move(item);
    producer_.tail = tail + 1;
    // Release publishes the slot's new value to the consumer's acquire.
    tail_.store(tail + 1, std::memory_order_release);
    return true;
  }

  // Consumer: the oldest entry, or nullptr when the buffer is empty. The
  // entry stays in place (and the producer will not touch it) until pop().
  [[nodiscard]] T* front() {
    const size_t head = consumer_.head;  // this side's copy of head_
    if (head == consumer_.cached_tail && !refreshTail(head)) return nullptr;
    return &slots_[head & mask_];
  }

  // Consumer: removes the oldest entry. Requires a non-empty buffer as this
  // consumer sees it (front() returned an entry, or tryPop would succeed).
  // The slot is reset to T{} so that what the entry owns is released now,
  // not when the producer reuses the slot.
  void pop() {
    assert(front() != nullptr && "RingBuffer::pop on an empty buffer");
    const size_t head = consumer_.head;
    slots_[head & mask_] = T{};
    consumer_.head = head + 1;
    // Release: the slot is free only after our last access to it.
    head_.store(head + 1, std::memory_order_release);
  }

  // Consumer: moves the oldest entry into `out` and removes it; false (and
  // `out` unchanged) when the buffer is empty.
  [[nodiscard]] bool tryPop(T& out) {
    const size_t head = consumer_.head;
    if (head == consumer_.cached_tail && !refreshTail(head)) return false;
    out = std::move(slots_[head & mask_]);
    consumer_.head = head + 1;
    head_.store(head + 1, std::memory_order_release);
    return true;
  }

  // Either side. head_ is read before tail_: tail_ only grows, so the
  // difference never underflows; if the consumer pops and the producer
  // pushes between the two loads it can exceed the capacity, hence the clamp.
  size_t size() const {
    const size_t head = head_.load(std::memory_order_acquire);
    const size_t tail = tail_.load(std::memory_order_acquire);
    const size_t used = tail - head;
    return used < capacity_ ? used : capacity_;
  }
  bool empty() const { return size() == 0; }
  bool full() const { return size() == capacity_; }

 private:
  // A constant rather than std::hardware_destructive_interference_size:
  // GCC warns (-Winterference-size) that the latter may change with the
  // compiler version or -mtune, which would change this class's layout
  // between translation units. x86-64 and most AArch64 cores use 64 bytes.
  static constexpr size_t kCacheLineSize = 64;

  static size_t checkedCapacity(size_t capacity) {
    // The slot count is capacity rounded up to a power of two, which must fit in size_t.
    constexpr size_t kMaxCapacity = size_t{1} << (std::numeric_limits<size_t>::digits - 1);
    if (capacity == 0 || capacity > kMaxCapacity) {
      throw UsageError("RingBuffer capacity must be between 1 and " + std::to_string(kMaxCapacity) + ", not " +
                       std::to_string(capacity));
    }
    return capacity;
  }

  // Consumer: reloads tail_ after the cached copy said "empty"; true when
  // entries have arrived since. Acquire pairs with the producer's release
  // of tail_, so the slots below it hold their new values.
  bool refreshTail(size_t head) {
    consumer_.cached_tail = tail_.load(std::memory_order_acquire);
    return head != consumer_.cached_tail;
  }

  // Invariants (head and tail are monotonically increasing counts of pops
  // and pushes; they wrap modulo 2^64, which the unsigned arithmetic below
  // tolerates because the slot count divides 2^64):
  //   head_ <= tail_ <= head_ + capacity_   (as differences: 0 <= tail_ - head_ <= capacity_)
  //   entries live in slots [head_, tail_), each at index & mask_, oldest first;
  //   capacity_ <= mask_ + 1, so no two live entries share a slot;
  //   producer_.cached_head <= head_ and consumer_.cached_tail <= tail_:
  //   a stale copy only makes a side think the buffer is fuller (or
  //   emptier) than it is, never the reverse, so it is safe to act on.
  // Each index and each cached copy has a cache line of its own: the
  // producer's push writes tail_ and reads only cached_head, so in steady
  // state the two cores exchange the index lines only on a reload.

  // Constant after construction, read by both sides.
  const size_t capacity_;
  const size_t mask_;  // slot count - 1; the slot count is a power of two
  const std::unique_ptr<T[]> slots_;

  alignas(kCacheLineSize) std::atomic<size_t> head_{0};  // written by the consumer only
  alignas(kCacheLineSize) std::atomic<size_t> tail_{0};  // written by the producer only
  // Each side's own copy of its index (always equal to the atomic it
  // publishes) and its last view of the other side's, on a line only that
  // side touches: the fast path never reads a shared index line, so
  // publishing an index costs one ownership transfer of its line rather
  // than a read followed by an upgrade.
  struct alignas(kCacheLineSize) ProducerState {
    size_t tail = 0;         // == tail_
    size_t cached_head = 0;  // the producer's last view of head_
  } producer_;
  struct alignas(kCacheLineSize) ConsumerState {
    size_t head = 0;         // == head_
    size_t cached_tail = 0;  // the consumer's last view of tail_
  } consumer_;
};

}  // namespace kiln

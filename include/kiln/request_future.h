// Future: the result of one ModelRunner::executeAsync request.
//
// A light future made for the runner's hot path: answering a request is
// an atomic store plus, only when a thread is waiting, one wake-up
// (std::promise pays a futex system call on every answer through its
// call_once). Future<void> is for requests whose outputs the caller
// allocated; Future<OutputTensors> hands over the tensors the runner
// allocated.
//
// Thread safety: one thread at a time uses a Future (like std::future);
// the runner answers it from a device thread.
#pragma once

#include <chrono>
#include <exception>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "kiln/tensor_info.h"

namespace kiln {

// An output the runner allocated.
struct HostTensor {
  TensorInfo info;
  std::vector<std::byte> bytes;
};
using OutputTensors = std::unordered_map<std::string, HostTensor>;

struct RequestState;  // the runner's record of a request (src/runtime/request.h)

namespace detail {
bool requestReady(const RequestState* state);
// Waits until the request is answered or `timeout` passes (negative: no
// limit); returns whether it was answered.
bool waitForRequest(RequestState* state, std::chrono::nanoseconds timeout);
const std::exception_ptr& requestError(const RequestState* state);
OutputTensors& requestTensors(RequestState* state);
void releaseRequest(RequestState* state);
bool cancelRequest(RequestState* state);
}  // namespace detail

template <typename T>
class Future {
  static_assert(std::is_void_v<T> || std::is_same_v<T, OutputTensors>);

 public:
  Future() = default;
  explicit Future(RequestState* state) : state_(state) {}
  Future(Future&& other) noexcept : state_(std::exchange(other.state_, nullptr)) {}
  Future& operator=(Future&& other) noexcept {
    if (this != &other) {
      reset();
      state_ = std::exchange(other.state_, nullptr);
    }
    return *this;
  }
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;
  ~Future() { reset(); }

  bool valid() const { return state_ != nullptr; }
  // True when the request has been answered (never blocks).
  bool ready() const { return state_ != nullptr && detail::requestReady(state_); }
  void wait() const { detail::waitForRequest(state_, std::chrono::nanoseconds(-1)); }
  // True when answered within `timeout`.
  template <typename Rep, typename Period>
  bool waitFor(std::chrono::duration<Rep, Period> timeout) const {
    return detail::waitForRequest(state_, std::chrono::duration_cast<std::chrono::nanoseconds>(timeout));
  }

  // Cancels the request if it has not started: true means it never runs
  // and no device reads or writes its memory from now on (the caller may
  // free it); the request then completes with RequestCancelledError when
  // the runner reaches it in its queue. False: it already started (or
  // ended) and completes as usual.
  bool cancel() { return detail::cancelRequest(state_); }

  // Waits, then returns the result or throws the request's error (a
  // DeviceError subclass, UsageError...). Leaves the future invalid.
  T get() {
    wait();
    RequestState* state = std::exchange(state_, nullptr);
    struct Release {
      RequestState* state;
      ~Release() { detail::releaseRequest(state); }
    } release{state};
    if (detail::requestError(state)) std::rethrow_exception(detail::requestError(state));
    if constexpr (!std::is_void_v<T>) return std::move(detail::requestTensors(state));
  }

 private:
  void reset() {
    if (state_ != nullptr) detail::releaseRequest(std::exchange(state_, nullptr));
  }
  RequestState* state_ = nullptr;
};

}  // namespace kiln

#include "runtime/request.h"

#include <algorithm>

#include "kiln/error.h"

namespace kiln::detail {

bool requestReady(const RequestState* state) { return state->answered.load(std::memory_order_acquire) != 0; }

bool waitForRequest(RequestState* state, std::chrono::nanoseconds timeout) {
  if (state == nullptr) throw UsageError("this Future holds no request (get() was called, or it was never set)");
  // Spin up to kSpin before sleeping: a caller streaming requests usually
  // finds its answer within that, and then the answering device thread
  // needs no system call to wake it.
  constexpr auto kSpin = std::chrono::microseconds(50);
  const auto start = std::chrono::steady_clock::now();
  const auto spin_until = start + std::min<std::chrono::nanoseconds>(kSpin, timeout.count() < 0 ? kSpin : timeout);
  do {
    for (int i = 0; i < 64; ++i) {
      if (requestReady(state)) return true;
    }
  } while (std::chrono::steady_clock::now() < spin_until);
  const auto deadline = start + timeout;
  for (;;) {
    const uint32_t ticket = state->answer_event.prepareWait();
    if (requestReady(state)) {
      state->answer_event.cancelWait();
      return true;
    }
    std::chrono::nanoseconds left(-1);
    if (timeout.count() >= 0) {
      left = deadline - std::chrono::steady_clock::now();
      if (left.count() <= 0) {
        state->answer_event.cancelWait();
        return false;
      }
    }
    state->answer_event.wait(ticket, left);
  }
}

const std::exception_ptr& requestError(const RequestState* state) { return state->error; }
OutputTensors& requestTensors(RequestState* state) { return state->tensors; }
void releaseRequest(RequestState* state) { state->release(); }
bool cancelRequest(RequestState* state) {
  if (state == nullptr) throw UsageError("this Future holds no request (get() was called, or it was never set)");
  return state->admission.cancel();
}

}  // namespace kiln::detail

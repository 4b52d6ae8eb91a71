#include "server/status.h"

#include "kiln/error.h"

namespace kiln::server {

int httpStatus(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kUnauthenticated: return 401;
    case StatusCode::kPayloadTooLarge: return 413;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kDeadlineExceeded: return 504;
    case StatusCode::kInternal: return 500;
  }
  return 500;
}

const char* statusName(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
    case StatusCode::kPayloadTooLarge: return "RESOURCE_EXHAUSTED";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "INTERNAL";
}

ServerError errorFromRunner(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const DeadlineExceededError& e) {
    return {StatusCode::kDeadlineExceeded, e.what()};
  } catch (const RequestCancelledError& e) {
    return {StatusCode::kUnavailable, e.what()};
  } catch (const RecoverableDeviceError& e) {
    // The runner resets the device or reruns: the next request may succeed.
    return {StatusCode::kUnavailable, e.what()};
  } catch (const ApplicationRuntimeError& e) {
    return {StatusCode::kInternal, e.what()};
  } catch (const DeviceError& e) {
    return {StatusCode::kInternal, e.what()};
  } catch (const UsageError& e) {
    // The server validates requests before they reach the runner, so a
    // UsageError here is the runner refusing work: draining or stopped.
    return {StatusCode::kUnavailable, e.what()};
  } catch (const std::exception& e) {
    return {StatusCode::kInternal, e.what()};
  } catch (...) {
    return {StatusCode::kInternal, "unknown error"};
  }
}

}  // namespace kiln::server

/* The C API (include/kiln/c_api.h, docs/c_api.md) end to end, in C:
 * open a package, list its inputs and outputs, run it once with an
 * executor, then send requests to a model runner asynchronously and check
 * that every answer matches the executor's.
 *
 * Usage: c_api_demo PACKAGE.kiln   (a CPU package with float32 tensors,
 * e.g. the one `make demo` writes to build/demo/runner_demo.kiln) */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/c_api.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    kiln_status status_ = (call);                                                        \
    if (status_ != KILN_OK) {                                                            \
      fprintf(stderr, "%s failed: %s: %s\n", #call, kiln_status_name(status_), kiln_last_error()); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

enum { kRequests = 8, kMaxTensors = 16 };

/* One request's tensors and what its callback saw. */
typedef struct {
  kiln_tensor inputs[kMaxTensors], outputs[kMaxTensors];
  atomic_int calls;
  atomic_int status;
} request;

static void on_complete(void* user_data, kiln_status status, const char* message) {
  request* r = user_data;
  atomic_store(&r->status, status);
  atomic_fetch_add(&r->calls, 1);
  if (status != KILN_OK) fprintf(stderr, "request failed: %s\n", message);
}

static void describe(const char* kind, const kiln_tensor_info* info) {
  printf("  %s %-12s dtype %d, shape [", kind, info->name, info->dtype);
  for (size_t d = 0; d < info->rank; ++d) printf(d == 0 ? "%lld" : ", %lld", (long long)info->shape[d]);
  printf("], %llu bytes\n", (unsigned long long)info->bytes);
}

/* A tensor of `info`'s size: inputs get a ramp, outputs zeros. */
static kiln_tensor make_tensor(const kiln_tensor_info* info, int is_input) {
  kiln_tensor t = {info->name, calloc(1, info->bytes), info->bytes, info->dtype};
  if (t.data == NULL) exit(1);
  if (is_input && info->dtype == KILN_F32) {
    float* values = t.data;
    for (uint64_t i = 0; i < info->bytes / sizeof(float); ++i) values[i] = 0.01f * (float)(i % 100);
  }
  return t;
}

/* Whether two outputs agree (floats within 1e-5 relative: the runner's
 * kernel threads may sum in another order than the executor's). */
static int same(const kiln_tensor* a, const kiln_tensor* b) {
  if (a->dtype != KILN_F32) return memcmp(a->data, b->data, a->bytes) == 0;
  const float *x = a->data, *y = b->data;
  for (uint64_t i = 0; i < a->bytes / sizeof(float); ++i) {
    const float scale = fabsf(y[i]) > 1.0f ? fabsf(y[i]) : 1.0f;
    if (fabsf(x[i] - y[i]) > 1e-5f * scale) return 0;
  }
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PACKAGE.kiln\n", argv[0]);
    return 2;
  }
  printf("kiln %s, C API %d\n", kiln_version(), KILN_C_API_VERSION);
  kiln_package* package = NULL;
  CHECK(kiln_package_open(argv[1], &package));

  /* The executor: one call at a time, on this thread. */
  kiln_executor* executor = NULL;
  CHECK(kiln_executor_create(package, NULL, &executor));
  const size_t n_in = kiln_executor_input_count(executor), n_out = kiln_executor_output_count(executor);
  if (n_in > kMaxTensors || n_out > kMaxTensors) return 1;
  kiln_tensor inputs[kMaxTensors], expected[kMaxTensors];
  kiln_tensor_info info;
  for (size_t i = 0; i < n_in; ++i) {
    CHECK(kiln_executor_input_info(executor, i, &info));
    describe("input ", &info);
    inputs[i] = make_tensor(&info, 1);
  }
  for (size_t j = 0; j < n_out; ++j) {
    CHECK(kiln_executor_output_info(executor, j, &info));
    describe("output", &info);
    expected[j] = make_tensor(&info, 0);
  }
  CHECK(kiln_executor_run(executor, inputs, n_in, expected, n_out));
  if (expected[0].dtype == KILN_F32) {
    const float* y = expected[0].data;
    printf("executor: %s[0..3] = %g %g %g %g\n", expected[0].name, y[0], y[1], y[2], y[3]);
  }

  /* The runner: thread-safe, batching, asynchronous. */
  kiln_runner* runner = NULL;
  CHECK(kiln_runner_create(package, NULL, &runner));
  kiln_package_free(package); /* the executor and the runner hold what they need */
  static request requests[kRequests];
  for (int r = 0; r < kRequests; ++r) {
    memcpy(requests[r].inputs, inputs, sizeof(kiln_tensor) * n_in);
    for (size_t j = 0; j < n_out; ++j) {
      requests[r].outputs[j] = expected[j];
      requests[r].outputs[j].data = calloc(1, expected[j].bytes);
    }
    CHECK(kiln_runner_execute_async(runner, requests[r].inputs, n_in, requests[r].outputs, n_out, on_complete,
                                    &requests[r]));
  }
  kiln_runner_free(runner); /* waits until every request is answered */

  int mismatches = 0;
  for (int r = 0; r < kRequests; ++r) {
    if (atomic_load(&requests[r].calls) != 1 || atomic_load(&requests[r].status) != KILN_OK) ++mismatches;
    for (size_t j = 0; j < n_out; ++j) {
      if (!same(&requests[r].outputs[j], &expected[j])) ++mismatches;
      free(requests[r].outputs[j].data);
    }
  }
  printf("runner: %d async requests answered, %d mismatches against the executor\n", kRequests, mismatches);

  for (size_t i = 0; i < n_in; ++i) free(inputs[i].data);
  for (size_t j = 0; j < n_out; ++j) free(expected[j].data);
  kiln_executor_free(executor);
  return mismatches == 0 ? 0 : 1;
}

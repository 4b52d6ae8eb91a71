/* kiln's C API: run compiled packages (.kiln) from C and from any language
 * that binds to C (Rust, Go, Java, C#...). docs/c_api.md is the guide;
 * examples/c_api_demo.c a complete program.
 *
 * The rules, for every function:
 *   - Each returns a kiln_status: KILN_OK, or the class of the failure.
 *     The failure's message is then kiln_last_error(), kept per thread
 *     until the thread's next failing call.
 *   - No C++ exception crosses this boundary; a NULL where a pointer is
 *     required is KILN_INVALID_ARGUMENT, never a crash.
 *   - Every handle is freed by its own function (kiln_*_free, which accept
 *     NULL). A package may be freed while executors or runners made from it
 *     live: they hold what they need.
 *   - Tensor memory is the caller's: inputs are read and outputs written
 *     in place, during the call (sync) or until the callback (async).
 *
 * Thread safety: a kiln_runner may be used from any number of threads at
 * once (concurrent requests share device batches); a kiln_executor runs one
 * call at a time; a kiln_package may be shared.
 *
 * Versioning: KILN_C_API_VERSION grows when functions are added; existing
 * ones keep their signatures and meaning within a major version of kiln.
 */
#ifndef KILN_C_API_H_
#define KILN_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_C_API_VERSION 1

typedef enum kiln_status {
  KILN_OK = 0,
  KILN_INVALID_ARGUMENT = 1,   /* a wrong name, size, dtype or option; a NULL pointer */
  KILN_IO_ERROR = 2,           /* a file could not be read */
  KILN_FORMAT_ERROR = 3,       /* not a kiln package, or a corrupt one */
  KILN_DEVICE_ERROR = 4,       /* the device failed (recoverable: the runner resets it) */
  KILN_APPLICATION_ERROR = 5,  /* the program failed on its inputs (e.g. an out-of-range index) */
  KILN_CANCELLED = 6,          /* the request was cancelled before it started */
  KILN_DEADLINE_EXCEEDED = 7,  /* the request's deadline passed before it started */
  KILN_UNAVAILABLE = 8,        /* the runner's queues are full, or it is shutting down */
  KILN_INTERNAL = 9            /* anything else (a bug: please report it) */
} kiln_status;

/* Element types, numbered as kiln's DType (and ONNX's TensorProto). */
typedef enum kiln_dtype {
  KILN_F32 = 1,
  KILN_U8 = 2,
  KILN_I8 = 3,
  KILN_U16 = 4,
  KILN_I16 = 5,
  KILN_I32 = 6,
  KILN_I64 = 7,
  KILN_BOOL = 9,
  KILN_F16 = 10,
  KILN_F64 = 11,
  KILN_U32 = 12,
  KILN_U64 = 13,
  KILN_BF16 = 16
} kiln_dtype;

#define KILN_MAX_RANK 8

/* What a model's input or output is. The strings live as long as the
 * handle they were read from. */
typedef struct kiln_tensor_info {
  const char* name;
  int32_t dtype; /* a kiln_dtype value (other kiln dtypes may appear) */
  size_t rank;
  int64_t shape[KILN_MAX_RANK];
  uint64_t bytes; /* of one call's whole tensor (runner: one compiled batch) */
} kiln_tensor_info;

/* A tensor in the caller's memory, bound by name. For a runner with a
 * batching dimension, `bytes` may hold any number of rows. */
typedef struct kiln_tensor {
  const char* name;
  void* data; /* inputs are only read */
  uint64_t bytes;
  int32_t dtype; /* a kiln_dtype value: checked against the model */
} kiln_tensor;

typedef struct kiln_package kiln_package;
typedef struct kiln_executor kiln_executor;
typedef struct kiln_runner kiln_runner;

/* The version of the library, e.g. "0.2.0" (KILN_VERSION in kiln/version.h,
 * as `kiln --version` prints). */
const char* kiln_version(void);
/* The message of this thread's last failed call ("" when none). */
const char* kiln_last_error(void);
/* "KILN_OK", "KILN_INVALID_ARGUMENT"... */
const char* kiln_status_name(kiln_status status);

/* Opens a package file (memory-mapped; checksums verified). */
kiln_status kiln_package_open(const char* path, kiln_package** out);
void kiln_package_free(kiln_package* package);

/* ---- Executor: one call at a time, on the calling thread (CPU). ---- */

typedef struct kiln_executor_options {
  const char* model; /* which model of the package; NULL or "": its only one */
  int32_t threads;   /* kernel threads; 0: the process default */
} kiln_executor_options;

/* `options` may be NULL for the defaults. */
kiln_status kiln_executor_create(const kiln_package* package, const kiln_executor_options* options,
                                 kiln_executor** out);
void kiln_executor_free(kiln_executor* executor);
size_t kiln_executor_input_count(const kiln_executor* executor);
size_t kiln_executor_output_count(const kiln_executor* executor);
kiln_status kiln_executor_input_info(const kiln_executor* executor, size_t index, kiln_tensor_info* out);
kiln_status kiln_executor_output_info(const kiln_executor* executor, size_t index, kiln_tensor_info* out);
/* Every input and output by name, each exactly its info's bytes. */
kiln_status kiln_executor_run(kiln_executor* executor, const kiln_tensor* inputs, size_t input_count,
                              const kiln_tensor* outputs, size_t output_count);

/* ---- Runner: the ModelRunner (docs/runtime.md), thread-safe, batching. ---- */

typedef struct kiln_runner_options {
  const char* model;         /* NULL or "": the package's only model */
  const char* device;        /* "cpu", "sim", "cuda"; NULL or "": the package's target */
  int64_t batching_dim;      /* the dimension requests batch on; -1: none */
  int64_t timeout_us;        /* how long a partial batch waits for more rows */
  uint32_t replicas;         /* replication_factor; 0 means 1 */
  int32_t threads;           /* kernel threads per replica; 0: the device's */
} kiln_runner_options;

/* The defaults: no batching dimension, 5 ms timeout, 1 replica. */
void kiln_runner_options_init(kiln_runner_options* options);

/* `options` may be NULL for the defaults. */
kiln_status kiln_runner_create(const kiln_package* package, const kiln_runner_options* options, kiln_runner** out);
/* Answers every request taken (callbacks included), then frees. */
void kiln_runner_free(kiln_runner* runner);
size_t kiln_runner_input_count(const kiln_runner* runner);
size_t kiln_runner_output_count(const kiln_runner* runner);
kiln_status kiln_runner_input_info(const kiln_runner* runner, size_t index, kiln_tensor_info* out);
kiln_status kiln_runner_output_info(const kiln_runner* runner, size_t index, kiln_tensor_info* out);

/* Runs one request and waits for it. */
kiln_status kiln_runner_execute(kiln_runner* runner, const kiln_tensor* inputs, size_t input_count,
                                const kiln_tensor* outputs, size_t output_count);

/* Called once per async request, on a runner thread, when it completes:
 * `status` KILN_OK with the outputs written, or the failure and its
 * message (valid during the call). Keep it short. */
typedef void (*kiln_callback)(void* user_data, kiln_status status, const char* message);

/* Enqueues one request, waiting for room in the runner's queues when they
 * are full, and returns; `callback` follows. A request refused before it
 * is enqueued (bad names or sizes) returns that status and the callback is
 * never called. The tensors' memory must stay valid until the callback. */
kiln_status kiln_runner_execute_async(kiln_runner* runner, const kiln_tensor* inputs, size_t input_count,
                                      const kiln_tensor* outputs, size_t output_count, kiln_callback callback,
                                      void* user_data);

/* The same, but never waits: full queues return KILN_UNAVAILABLE at once
 * (back-pressure for servers), and the callback is not called. */
kiln_status kiln_runner_try_execute_async(kiln_runner* runner, const kiln_tensor* inputs, size_t input_count,
                                          const kiln_tensor* outputs, size_t output_count, kiln_callback callback,
                                          void* user_data);

#ifdef __cplusplus
}
#endif

#endif /* KILN_C_API_H_ */

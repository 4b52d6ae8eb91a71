/* Runs a package through the C API with every float input set to 1, and
 * prints every float output: built with pkg-config against an installed
 * kiln (CMakeLists.txt says how).
 *
 * Usage: run_package PACKAGE.kiln */
#include <stdio.h>
#include <stdlib.h>

#include "kiln/c_api.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  kiln_package* package = NULL;
  kiln_executor* executor = NULL;
  if (kiln_package_open(argv[1], &package) != KILN_OK ||
      kiln_executor_create(package, NULL, &executor) != KILN_OK) {
    fprintf(stderr, "%s\n", kiln_last_error());
    return 1;
  }
  kiln_package_free(package);
  size_t n_in = kiln_executor_input_count(executor), n_out = kiln_executor_output_count(executor);
  kiln_tensor* tensors = calloc(n_in + n_out, sizeof(kiln_tensor));
  for (size_t k = 0; k < n_in + n_out; ++k) {
    kiln_tensor_info info;
    if (k < n_in) {
      kiln_executor_input_info(executor, k, &info);
    } else {
      kiln_executor_output_info(executor, k - n_in, &info);
    }
    if (info.dtype != KILN_F32) return 1;
    float* values = malloc(info.bytes);
    for (uint64_t i = 0; i < info.bytes / sizeof(float); ++i) values[i] = k < n_in ? 1.0f : 0.0f;
    tensors[k] = (kiln_tensor){info.name, values, info.bytes, KILN_F32};
  }
  if (kiln_executor_run(executor, tensors, n_in, tensors + n_in, n_out) != KILN_OK) {
    fprintf(stderr, "%s\n", kiln_last_error());
    return 1;
  }
  for (size_t j = n_in; j < n_in + n_out; ++j) {
    const float* y = tensors[j].data;
    for (uint64_t i = 0; i < tensors[j].bytes / sizeof(float); ++i) printf("%s[%llu] = %g\n", tensors[j].name, (unsigned long long)i, y[i]);
  }
  for (size_t k = 0; k < n_in + n_out; ++k) free(tensors[k].data);
  free(tensors);
  kiln_executor_free(executor);
  printf("kiln %s\n", kiln_version());
  return 0;
}

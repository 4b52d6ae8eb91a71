# The commands a kiln developer or user types. Each one installs what is
# missing (scripts/setup) and builds first, so it works on a fresh machine.
#
#   make demo        write an example package and dump it; serve a small model with the
#                    ModelRunner (async requests, dynamic batching, a sim device) and run
#                    it again from C through the C API;
#                    read rendered text with a real OCR model (examples/ocr_demo.py)
#   make zoo         the real public models of bench/zoo against onnxruntime and OpenVINO
#   make test        unit tests, command-line tests, kiln serve's tests, a 60-second fuzz run
#   make test-asan   the unit, command-line and kiln serve tests under AddressSanitizer + UBSan
#   make test-tsan   the runtime's, the devices', the C API's and the server's threads
#                    tests (ctest label tsan) under ThreadSanitizer
#   make test-wheel  `pip install .` into a fresh virtual environment, then compile and run
#                    a model with the installed package (a full build of its own: not in
#                    make test)
#   make soak        100,000 requests through a ModelRunner with random faults, bad
#                    requests, deadlines and cancellations (make test runs 10,000),
#                    then 100,000 through kiln serve over HTTP and gRPC (make test: 2,000)
#   make bench       benchmarks: zero-copy open, RingBuffer against boost, the model
#                    runner's overhead and pipelining, six models against
#                    onnxruntime and OpenVINO (bench/compare.py writes bench/RESULTS.md),
#                    and kiln serve under perf_analyzer against KServe's server
#                    (bench/serve/serve_bench.py)
#   make conformance the ONNX backend node tests through kiln and onnxruntime; writes
#                    docs/conformance.md
#   make fuzz        build the fuzz targets with clang and fuzz (FUZZ_SECONDS)
#   make fuzz-long   each fuzz target for FUZZ_RUNS inputs, finds merged into tests/fuzz/corpus

SHELL := /bin/bash
WERROR ?= OFF
FUZZ_SECONDS ?= 600
TEST_FUZZ_SECONDS ?= 60
SOAK_REQUESTS ?= 100000
FUZZ_RUNS ?= 100000000
BENCH_SIZE_MIB ?= 1024
CMAKE_ARGS := -DKILN_WERROR=$(WERROR)
PYTEST := .venv/bin/python -m pytest -q
PYTEST_SERVE := .venv-serve/bin/python -m pytest -q

.PHONY: all setup build build-asan build-tsan build-fuzz demo test test-unit test-asan test-tsan test-wheel soak bench fuzz fuzz-run fuzz-long fuzz-merge clean \
	conformance conformance-data conformance-check zoo

all: build

setup:
	@scripts/setup

build: setup
	cmake --preset release $(CMAKE_ARGS) -DKILN_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(CURDIR)/.venv/bin/python \
	  -Dnanobind_DIR=$$(.venv/bin/python -m nanobind --cmake_dir) > /dev/null
	cmake --build --preset release

build-asan: setup
	cmake --preset asan $(CMAKE_ARGS) > /dev/null
	cmake --build --preset asan

# Only the runtime's tests: they are the threaded ones.
build-tsan: setup
	cmake --preset tsan $(CMAKE_ARGS) > /dev/null
	cmake --build --preset tsan --target kiln_runtime_tests kiln_device_tests kiln_soak_tests kiln_server_tests kiln_c_api_tests

build-fuzz: setup
	cmake --preset fuzz $(CMAKE_ARGS) > /dev/null
	cmake --build --preset fuzz --target reader_fuzz onnx_import_fuzz graph_codec_fuzz npy_fuzz request_fuzz package_fuzz graph_run_fuzz plugin_fuzz http_infer_fuzz

demo: build
	@mkdir -p build/demo
	build/release/examples/write_example_package build/demo/example.kiln
	build/release/tools/kiln dump --all build/demo/example.kiln
	build/release/examples/runner_demo build/demo/runner_demo.kiln
	build/release/examples/c_api_demo build/demo/runner_demo.kiln
	OMP_NUM_THREADS=2 PYTHONPATH=build/release/python .venv/bin/python examples/ocr_demo.py

test-unit: build
	ctest --test-dir build/release --output-on-failure -j2
	KILN_BUILD_DIR=build/release $(PYTEST) tests/cli
	PYTHONPATH=build/release/python $(PYTEST) python/tests
	KILN_BUILD_DIR=build/release $(PYTEST_SERVE) tests/server
	KILN_BUILD_DIR=build/release .venv-ray/bin/python -m pytest -q tests/ray
	.venv/bin/python bench/zoo/zoo.py check
	$(MAKE) --no-print-directory conformance-check

# The short fuzz run comes first so that the test runners' summaries close
# the output.
test: build
	$(MAKE) --no-print-directory fuzz-run FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)
	$(MAKE) --no-print-directory test-unit

test-asan: build-asan
	ctest --test-dir build/asan --output-on-failure -j2
	KILN_BUILD_DIR=build/asan $(PYTEST) tests/cli
	KILN_BUILD_DIR=build/asan $(PYTEST_SERVE) tests/server

# Any race report fails its test (TSan exits with 66). The suppressions
# silence libgomp, which TSan cannot see into (tests/tsan_suppressions.txt).
test-tsan: build-tsan
	TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan_suppressions.txt second_deadlock_stack=1" \
	  ctest --test-dir build/tsan -L tsan --output-on-failure -j2

# The wheel builds kiln again in build/wheel (pyproject.toml), which takes
# as long as `make build` the first time; hence not part of make test.
test-wheel: build
	KILN_BUILD_DIR=build/release KILN_TEST_WHEEL=1 $(PYTEST) tests/cli/test_wheel.py

zoo: build
	.venv/bin/python bench/zoo/zoo.py bench

soak: build
	KILN_SOAK_REQUESTS=$(SOAK_REQUESTS) build/release/tests/runtime/kiln_soak_tests
	KILN_SERVE_SOAK=$(SOAK_REQUESTS) KILN_BUILD_DIR=build/release $(PYTEST_SERVE) -s tests/server/test_soak.py

bench: build
	@mkdir -p build/bench
	build/release/bench/zero_copy_bench --size-mib $(BENCH_SIZE_MIB) --dir build/bench
	build/release/bench/ring_buffer_bench --repetitions 7
	build/release/bench/runner_bench
	.venv/bin/python bench/models/make_models.py build/bench/models
	.venv/bin/python bench/compare.py
	.venv-serve/bin/python bench/serve/serve_bench.py

conformance-data: setup
	.venv/bin/python tests/conformance/generate_node_tests.py build/conformance/node

# Both backends over every node test; rewrites docs/conformance.md.
conformance: build conformance-data
	PYTHONPATH=build/release/python .venv/bin/python tests/conformance/run_conformance.py \
	  --write-docs docs/conformance.md

# kiln alone: fails when a test listed in tests/conformance/expected_pass.txt
# no longer passes.
conformance-check: build conformance-data
	PYTHONPATH=build/release/python .venv/bin/python tests/conformance/run_conformance.py --backend kiln

fuzz: fuzz-run

# Fuzzes copies of the seed corpora, so that runs never change the
# repository: the package reader for FUZZ_SECONDS, the ONNX importer and the
# graph codec, package loading (package_fuzz) and compile-and-run
# (graph_run_fuzz) for half that each, the .npy reader and requests for a
# quarter. Logs: build/fuzz/<target>.log; crashing inputs: build/fuzz/.
fuzz-run: build-fuzz
	@scripts/fuzz reader_fuzz tests/format/fuzz_seeds tests/format/reader_fuzz.dict $(FUZZ_SECONDS)
	@scripts/fuzz onnx_import_fuzz tests/frontend/fuzz_seeds tests/frontend/onnx_import_fuzz.dict $$(( $(FUZZ_SECONDS) / 2 ))
	@scripts/fuzz graph_codec_fuzz tests/ir/fuzz_seeds "" $$(( $(FUZZ_SECONDS) / 2 ))
	@scripts/fuzz npy_fuzz tests/cli/npy_fuzz_seeds "" $$(( $(FUZZ_SECONDS) / 4 ))
	@scripts/fuzz request_fuzz tests/runtime/request_fuzz_seeds "" $$(( $(FUZZ_SECONDS) / 4 ))
	@scripts/fuzz package_fuzz tests/runtime/package_fuzz_seeds "" $$(( $(FUZZ_SECONDS) / 2 ))
	@scripts/fuzz graph_run_fuzz "" "" $$(( $(FUZZ_SECONDS) / 2 ))
	@scripts/fuzz plugin_fuzz tests/plugins/fuzz_seeds "" $$(( $(FUZZ_SECONDS) / 4 ))
	@scripts/fuzz http_infer_fuzz tests/server/http_infer_fuzz_seeds "" $$(( $(FUZZ_SECONDS) / 4 ))

# Long campaigns: each target for FUZZ_RUNS inputs (10^8 by default: hours per
# target on 2 cores), then its finds merged into the committed corpus.
fuzz-long: build-fuzz
	@scripts/fuzz reader_fuzz tests/format/fuzz_seeds tests/format/reader_fuzz.dict 0 $(FUZZ_RUNS)
	@scripts/fuzz onnx_import_fuzz tests/frontend/fuzz_seeds tests/frontend/onnx_import_fuzz.dict 0 $(FUZZ_RUNS)
	@scripts/fuzz graph_codec_fuzz tests/ir/fuzz_seeds "" 0 $(FUZZ_RUNS)
	@scripts/fuzz npy_fuzz tests/cli/npy_fuzz_seeds "" 0 $(FUZZ_RUNS)
	@scripts/fuzz request_fuzz tests/runtime/request_fuzz_seeds "" 0 $(FUZZ_RUNS)
	@scripts/fuzz package_fuzz tests/runtime/package_fuzz_seeds "" 0 $(FUZZ_RUNS)
	@scripts/fuzz graph_run_fuzz "" "" 0 $(FUZZ_RUNS)
	@scripts/fuzz plugin_fuzz tests/plugins/fuzz_seeds "" 0 $(FUZZ_RUNS)
	@scripts/fuzz http_infer_fuzz tests/server/http_infer_fuzz_seeds "" 0 $(FUZZ_RUNS)
	$(MAKE) --no-print-directory fuzz-merge

# Minimises each target's committed corpus together with the last run's
# (libFuzzer -merge=1: the smallest set of inputs with the same coverage).
fuzz-merge: build-fuzz
	@for t in reader_fuzz onnx_import_fuzz graph_codec_fuzz npy_fuzz request_fuzz package_fuzz graph_run_fuzz plugin_fuzz http_infer_fuzz; do \
	  mkdir -p tests/fuzz/corpus/$$t build/fuzz/merged-$$t && rm -rf build/fuzz/merged-$$t/*; \
	  build/fuzz/tests/$$t -merge=1 -max_len=8192 build/fuzz/merged-$$t tests/fuzz/corpus/$$t build/fuzz/corpus-$$t \
	    > build/fuzz/$$t-merge.log 2>&1 || { tail -n 20 build/fuzz/$$t-merge.log; exit 1; }; \
	  rm -rf tests/fuzz/corpus/$$t && mv build/fuzz/merged-$$t tests/fuzz/corpus/$$t; \
	  echo "fuzz-merge $$t: $$(ls tests/fuzz/corpus/$$t | wc -l) inputs"; \
	done

clean:
	rm -rf build

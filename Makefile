# The commands a kiln developer or user types. Each one installs what is
# missing (scripts/setup) and builds first, so it works on a fresh machine.
#
#   make demo        write an example package and dump it
#   make test        unit tests, command-line tests, a 60-second fuzz run
#   make test-asan   the same tests under AddressSanitizer + UBSan
#   make bench       benchmarks (figures go into bench/RESULTS.md)
#   make fuzz        build the fuzz targets with clang and fuzz (FUZZ_SECONDS)

SHELL := /bin/bash
WERROR ?= OFF
FUZZ_SECONDS ?= 600
TEST_FUZZ_SECONDS ?= 60
BENCH_SIZE_MIB ?= 1024
CMAKE_ARGS := -DKILN_WERROR=$(WERROR)
PYTEST := .venv/bin/python -m pytest -q

.PHONY: all setup build build-asan build-fuzz demo test test-unit test-asan bench fuzz fuzz-run clean

all: build

setup:
	@scripts/setup

build: setup
	cmake --preset release $(CMAKE_ARGS) > /dev/null
	cmake --build --preset release

build-asan: setup
	cmake --preset asan $(CMAKE_ARGS) > /dev/null
	cmake --build --preset asan

build-fuzz: setup
	cmake --preset fuzz $(CMAKE_ARGS) > /dev/null
	cmake --build --preset fuzz

demo: build
	@mkdir -p build/demo
	build/release/examples/write_example_package build/demo/example.kiln
	build/release/tools/kiln dump --all build/demo/example.kiln

test-unit: build
	ctest --test-dir build/release --output-on-failure -j2
	KILN_BUILD_DIR=build/release $(PYTEST) tests/cli

# The short fuzz run comes first so that the test runners' summaries close
# the output.
test: build
	$(MAKE) --no-print-directory fuzz-run FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)
	$(MAKE) --no-print-directory test-unit

test-asan: build-asan
	ctest --test-dir build/asan --output-on-failure -j2
	KILN_BUILD_DIR=build/asan $(PYTEST) tests/cli

bench: build
	@mkdir -p build/bench
	build/release/bench/zero_copy_bench --size-mib $(BENCH_SIZE_MIB) --dir build/bench

fuzz: fuzz-run

# Fuzzes a copy of the seed corpus, so that runs never change the repository.
# The full log is build/fuzz/fuzz.log; a crashing input is saved in build/fuzz.
fuzz-run: build-fuzz
	@rm -rf build/fuzz/corpus && mkdir -p build/fuzz/corpus && cp tests/format/fuzz_seeds/* build/fuzz/corpus/ && rm build/fuzz/corpus/README.md
	@echo "fuzzing the package reader for $(FUZZ_SECONDS) s ..."
	@cd build/fuzz && if ./tests/reader_fuzz -dict=../../tests/format/reader_fuzz.dict \
	    -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	    corpus > fuzz.log 2>&1; then \
	  grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^Done' fuzz.log; \
	  echo "fuzz: no crash"; \
	else \
	  tail -n 60 fuzz.log; echo "fuzz: FAILED (inputs: build/fuzz/crash-*, log: build/fuzz/fuzz.log)"; exit 1; \
	fi

clean:
	rm -rf build

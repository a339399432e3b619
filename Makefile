# Quick start on a fresh Debian 12 machine (as root, or with sudo):
#   make run    install dependencies, build, serve on 0.0.0.0:8001
#   make test   install dependencies, build, run the test suite
# `make` itself is needed to start; deploy/install_deps.sh installs the rest.

BUILD_DIR  ?= build
BUILD_TYPE ?= Release
JOBS       ?= 2
SERVER     := $(BUILD_DIR)/server/attnserve

.PHONY: all deps test-deps build run test sanitize fuzz bench clean

all: build

deps:
	bash deploy/install_deps.sh --build

test-deps:
	bash deploy/install_deps.sh

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)
	cmake --build $(BUILD_DIR) -j$(JOBS)

# Runs in the foreground with the default flags; pass more with
# `make run ARGS='--grpc_port=9001'`. Ctrl-C drains and exits 0.
run: build
	exec $(SERVER) --model_repository=deploy/models $(ARGS)

test: test-deps build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS)

# The suite under AddressSanitizer + UndefinedBehaviorSanitizer, and our
# concurrent code under ThreadSanitizer (build-asan/, build-tsan/).
sanitize: test-deps
	bash tests/sanitizers/run_sanitizers.sh

# Every libFuzzer target (fuzz/README.md): a clang + sanitizer build in
# fuzz/build, the regression inputs of fuzz/regressions/ replayed, then
# FUZZ_SECONDS of fuzzing each (CI: 30).
FUZZ_SECONDS ?= 60
fuzz: test-deps
	FUZZ_JOBS=$(JOBS) bash fuzz/run_fuzzers.sh $(FUZZ_SECONDS)

bench: build
	bash bench/run_benchmarks.sh

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan fuzz/build

# Thin wrapper over CMake: the two commands a newcomer needs, plus build and clean.
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CTEST_ARGS ?=
CMAKE_ARGS ?=
PREFIX ?= /usr/local

ifeq ($(SANITIZE),1)
BUILD_DIR := build-asan
CMAKE_ARGS += -DBATON_SANITIZE=ON
BUILD_TYPE := Debug
endif

.PHONY: all deps test-deps build test demo install clean fuzz

all: build

deps:
	@sh scripts/install-deps.sh

test-deps:
	@sh scripts/install-deps.sh --test

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

build: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: test-deps build
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 -j $(JOBS) $(CTEST_ARGS)

# The three programs, libbaton (libbaton.so.MAJOR, libbaton.a, include/baton/*.h, baton.pc), the
# systemd units and the example configuration; see docs/OPERATIONS.md ("Install").
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# The demo builds only the two programs it runs (the tests build under `make test`).
demo: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS) --target baton baton-worker
	@sh scripts/demo.sh $(BUILD_DIR)

# libFuzzer harnesses (fuzz/, docs/SECURITY.md "Fuzzing"): clang, ASan + UBSan, in build-fuzz/.
# Run one long: build-fuzz/fuzz/fuzz_pdreq -runs=10000000 CORPUS_DIR fuzz/corpus/fuzz_pdreq
FUZZ_DIR ?= build-fuzz
fuzz:
	cmake -S . -B $(FUZZ_DIR) -DCMAKE_C_COMPILER=clang -DBATON_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(FUZZ_DIR) --target baton_fuzzers -j $(JOBS)

clean:
	rm -rf build build-asan build-fuzz

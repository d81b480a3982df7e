# Convenience front end over CMake. The README's two commands:
#   make demo   installs what the build needs, builds, and runs the main job
#               (DEMO=qa: the seed's fake-data stress test instead)
#   make test   installs everything the tests need, builds, and runs every
#               test (also an ASan+UBSan build of the tests, and the fuzz
#               targets).
# and the developers' loop:
#   make check  builds and runs the unit tests (ctest -L unit).
PREFIX ?= /usr/local
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
JOBS ?= $(shell nproc)
# Tests run side by side: twice the cores, since most scenario tests wait on
# sockets and timers; a CPU-heavy test holds two slots (PROCESSORS 2 in
# tests/*.cmake) and tests that share something name it (RESOURCE_LOCK).
TEST_JOBS ?= $(shell echo $$(( $(JOBS) * 2 )))
CMAKE_FLAGS ?=

.PHONY: all deps deps-demo build demo check test test-suite test-asan test-fuzz install \
  install-torchrun clean

all: build

# Every purpose (scripts/deps.sh); deps-demo only what building needs.
deps:
	./scripts/deps.sh

deps-demo:
	./scripts/deps.sh demo

build:
	cmake -S . -B $(BUILD) -DCOHORT_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

demo: deps-demo
	$(MAKE) build
	./scripts/demo.sh $(if $(filter qa,$(DEMO)),--qa) $(BUILD)

check: build
	cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS) -L unit

# The three parts share no build directory, so they run side by side (each
# one's output shown when it ends): the whole suite, the ASan+UBSan build
# with the unit tests, the fuzz targets. Most of the suite waits on sockets
# and timers; the other two fill the cores meanwhile. Beside the suite the
# fuzz targets run one at a time (FUZZ_JOBS=1): 15 x 30 s still ends before
# the suite, and each target gets a whole core's share. With 18 targets the fuzzing
# was the tail (568 s against the suite's 456 s): 25 s each ends with the suite.
test: deps build
	$(MAKE) --no-print-directory -j3 -O test-suite test-asan test-fuzz FUZZ_JOBS=1 \
	  FUZZ_SECONDS=25

test-suite: build
	cd $(BUILD) && ctest --output-on-failure --timeout 900 -j $(TEST_JOBS)

# Every libFuzzer target, bounded (scripts/fuzz-ci.sh; needs clang):
# FUZZ_JOBS targets at a time, each for the same COHORT_FUZZ_SECONDS.
FUZZ_JOBS ?= $(JOBS)
FUZZ_SECONDS ?= 30
test-fuzz:
	JOBS=$(JOBS) FUZZ_JOBS=$(FUZZ_JOBS) COHORT_FUZZ_SECONDS=$(FUZZ_SECONDS) \
	  ./scripts/fuzz-ci.sh $(FUZZ_BUILD)

test-asan:
	cmake -S . -B $(ASAN_BUILD) -DCOHORT_WERROR=ON -DCOHORT_SANITIZE=address,undefined \
	  -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS) >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure --timeout 900 -j $(TEST_JOBS) -L unit

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# cohort, and a link named torchrun to it (`cohort run` under torchrun's name).
install-torchrun: install
	cmake --install $(BUILD) --prefix $(PREFIX) --component torchrun

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)

# Convenience front end over CMake. The README's two commands:
#   make demo   installs what the build needs, builds, and runs the main job
#               (DEMO=qa: the seed's fake-data stress test instead)
#   make test   installs everything the tests need, builds, and runs every
#               test (also an ASan+UBSan build of the tests).
PREFIX ?= /usr/local
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps deps-demo build demo test test-asan test-fuzz install install-torchrun clean

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

test: deps build
	cd $(BUILD) && ctest --output-on-failure --timeout 900 -j 1
	$(MAKE) test-asan
	$(MAKE) test-fuzz

# Every libFuzzer target, bounded (scripts/fuzz-ci.sh; needs clang).
test-fuzz:
	JOBS=$(JOBS) ./scripts/fuzz-ci.sh $(FUZZ_BUILD)

test-asan:
	cmake -S . -B $(ASAN_BUILD) -DCOHORT_WERROR=ON -DCOHORT_SANITIZE=address,undefined \
	  -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS) >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure --timeout 900 -j 1 -L unit

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# cohort, and a link named torchrun to it (`cohort run` under torchrun's name).
install-torchrun: install
	cmake --install $(BUILD) --prefix $(PREFIX) --component torchrun

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)

# The two commands of the README, plus their parts.
#   make run    configure + build (Release) into build/, then run `flashattn run`
#   make test   configure (with the Python module when nanobind is importable) + build + ctest
# Variables: BUILD (build directory), JOBS (parallel compile jobs), CMAKE_ARGS (extra
# configure flags, e.g. CMAKE_ARGS=-DFLASHATTN_CUDA=OFF).

BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
# The Python that has nanobind: the project's .venv (made by scripts/install-deps.sh) if present.
PYTHON ?= $(shell if [ -x .venv/bin/python ]; then echo .venv/bin/python; else echo python3; fi)
HAS_NANOBIND = $(shell $(PYTHON) -c 'import nanobind' >/dev/null 2>&1 && echo ON || echo OFF)

.PHONY: run test build configure deps deps-with-python clean

run: build
	./$(BUILD)/tools/flashattn run

# deps-with-python runs first so that HAS_NANOBIND sees a freshly made .venv.
test: deps-with-python
	$(MAKE) --no-print-directory build PYTHON_MODULE=$(HAS_NANOBIND)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

deps-with-python:
	@scripts/install-deps.sh

# The Python test dependencies only when the Python module is being built.
deps:
	@scripts/install-deps.sh $(if $(filter ON,$(PYTHON_MODULE)),,--no-python)

# PYTHON_MODULE=ON|OFF; `make run` leaves it as the build directory has it.
configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  $(if $(PYTHON_MODULE),-DFLASHATTN_BUILD_PYTHON=$(PYTHON_MODULE)) \
	  -DPython_EXECUTABLE=$(abspath $(shell command -v $(PYTHON))) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)
	ln -sf tools/flashattn $(BUILD)/flashattn

clean:
	rm -rf $(BUILD)

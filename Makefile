# Two commands for a newcomer: `make demo` and `make test`.
# Both create .venv when missing and reinstall only when the requirements change.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JOBS ?= 2
DEMO_DIR ?= runs/benchmark_digits

.PHONY: demo test test-slow test-load update-expected bench install clean-venv

$(PY):
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "calib_jax needs Python >= 3.11, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)

# A fresh venv's setuptools may predate PEP 660 editable installs (and ship no
# wheel), so the build tools are brought up to date first.
$(STAMP): $(PY) requirements.txt requirements-test.txt constraints.txt pyproject.toml
	$(PY) -m pip install -q --disable-pip-version-check -U 'pip>=24' 'setuptools>=68' wheel
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt \
		-r requirements.txt -r requirements-test.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# The tpu-aot extra (libtpu matched to the pinned jax): the slow tests compile
# a train step for a TPU slice ahead of time, so they install it rather than skip.
TPU_AOT_STAMP := $(VENV)/.installed-tpu-aot
$(TPU_AOT_STAMP): $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt \
		--no-build-isolation -e '.[tpu-aot]'
	touch $(TPU_AOT_STAMP)

demo: $(STAMP)
	$(PY) -m calib_jax.benchmark --config configs/benchmark_digits.py \
		--workdir $(DEMO_DIR)

test: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) -m pytest -n $(JOBS) -m 'not slow and not long' --durations=20 tests

# make test as CI runs it on a shared machine: beside LOAD busy CPU-bound
# processes (stopped however make test ends), then the wall time, the exit
# status and the load averages at the start and the end. No verdict of
# make test depends on the load; this is how that is checked.
LOAD ?= 4
test-load: $(STAMP)
	LOAD=$(LOAD) MAKE=$(MAKE) .ci/test_load.sh

# The TPU compile loads libtpu into its process; it runs in a pytest process of
# its own so that no other test shares a process with libtpu. The `long` tests
# (unit and end-to-end tests over make test's time budget) also run in pytest
# processes of their own, apart from the slow end-to-end ones (emulated
# buckets, subprocess pods): the same company they keep in make test.
# The long tests run as LONG_GROUPS, one pytest session (fresh workers) per
# group, each a few hundred tests: one worker of a single session over all
# of them (about 1,300) died of a segmentation fault inside an XLA:CPU compile
# after compiling the programs of several hundred tests, which no session of
# that size ever did. Every group runs, and the step fails if any failed.
TPU_TEST := tests/test_tpu_aot.py::test_resnet20_sb_ece_step_compiles_and_fits_on_v5e_2x2
LONG_DIRS := tests/losses tests/metrics tests/posthoc tests/conformal
LONG_GROUPS := tests/losses tests/metrics 'tests/posthoc tests/conformal' \
	'tests $(foreach d,$(LONG_DIRS),--ignore=$(d))'
test-slow: $(STAMP) $(TPU_AOT_STAMP)
	@failed=""; for group in $(LONG_GROUPS); do \
		echo "== long tests: $$group"; \
		JAX_PLATFORMS=cpu $(PY) -m pytest -n $(JOBS) -m 'long and not slow' \
			--durations=10 $$group || failed="$$failed [$$group]"; \
	done; \
	if [ -n "$$failed" ]; then echo "long tests failed in:$$failed"; exit 1; fi
	JAX_PLATFORMS=cpu $(PY) -m pytest -n $(JOBS) -m slow tests --deselect $(TPU_TEST)
	JAX_PLATFORMS=cpu $(PY) -m pytest -m slow $(TPU_TEST)

# Reruns the quick benchmark and the demo grid (about 8 min on a quiet 2-core
# CPU) and rewrites tests/benchmark/expected/ and the README's claims summary
# from them: run it, and say why in the commit message, when results change on
# purpose. UPDATE_QUICK_DIR / UPDATE_DEMO_DIR: finished runs to read back instead.
UPDATE_QUICK_DIR ?=
UPDATE_DEMO_DIR ?=
update-expected: $(STAMP)
	$(PY) experiments/update_expected.py --quick_workdir=$(UPDATE_QUICK_DIR) \
		--demo_workdir=$(UPDATE_DEMO_DIR)

bench: $(STAMP)
	$(PY) benchmarks/losses.py

clean-venv:
	rm -rf $(VENV)

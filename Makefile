# Two commands do all the set-up on a fresh machine (Python 3.11 and a C compiler are enough):
#   make demo   builds .venv, installs day0 + vLLM, runs the Day0 suites on the embedded tiny model
#   make test   same install, then ruff and the harness's own test suite
VENV ?= .venv
PROFILE ?= cpu-tiny
PYTEST_ARGS ?=
# Two xdist workers: tests that start vLLM engines, and those that hold network namespaces or the
# Slurm, each run one at a time on one worker (tests/conftest.py); the rest go by file to either.
TEST_WORKERS ?= 2

BENCH_ARGS ?=

.PHONY: install demo test bench clean-reports

install:
	@bash scripts/install.sh

demo: install
	@bash scripts/install-system.sh net
	$(VENV)/bin/python -m pytest day0/suites -m day0 --day0-profile $(PROFILE) -v $(PYTEST_ARGS)

test: install
	@bash scripts/install-system.sh net browser slurm lint
	$(VENV)/bin/ruff check day0 tests scripts benchmarks conftest.py
	@# ~1,000 tests run a day0 command in a fresh process; where PYTHONDONTWRITEBYTECODE is set (the
	@# suite sets it for those processes) each would compile day0's modules again (~0.25 s a process)
	$(VENV)/bin/python -m compileall -q day0 tests
	$(VENV)/bin/python -m pytest tests -n $(TEST_WORKERS) --dist loadgroup -v --durations=15 $(PYTEST_ARGS)

# In-process benchmarks (pytest-benchmark), saved under .benchmarks/ for --benchmark-compare;
# the scripts in benchmarks/ that pair day0 with another tool run on their own (README there).
bench: install
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e ".[bench]" 2>&1 | { grep -v "is ignored" || true; }
	$(VENV)/bin/python -m pytest benchmarks -p no:randomly --benchmark-autosave --benchmark-columns=min,median,max,rounds $(BENCH_ARGS)

clean-reports:
	rm -rf reports/*/ reports/latest

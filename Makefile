# Two commands do all the set-up on a fresh machine (Python 3.11 and a C compiler are enough):
#   make demo   builds .venv, installs day0 + vLLM, runs the Day0 suites on the embedded tiny model
#   make test   same install, then the harness's own test suite
VENV ?= .venv
PROFILE ?= cpu-tiny
PYTEST_ARGS ?=

.PHONY: install demo test clean-reports

install:
	@bash scripts/install.sh

demo: install
	$(VENV)/bin/python -m pytest day0/suites -m day0 --day0-profile $(PROFILE) -v $(PYTEST_ARGS)

test: install
	@bash scripts/install-browser.sh
	$(VENV)/bin/python -m pytest tests -v --durations=15 $(PYTEST_ARGS)

clean-reports:
	rm -rf reports/*/ reports/latest

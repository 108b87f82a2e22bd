# `make demo` and `make test` work on a fresh machine with Python 3 and make.
# PADDLE picks the paddlepaddle version; each version gets its own virtual environment.
PYTHON ?= python3
PADDLE ?= 3.3.1
VENV := .venv-paddle$(PADDLE)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-long test-matrix lint docs docs-output docs-drift docs-figures dist venv clean

venv: $(STAMP)

# Before 3.3, Paddle's fleet cannot read its own strategy with protobuf 7
# ("hybrid_configs is not a attribute of DistributedStrategy"); 5.29 and 6.x work.
PROTOBUF_BEFORE_PADDLE_3_3 := "protobuf>=5.29,<7"
PINS := $(if $(filter 2.6.% 3.0.% 3.1.% 3.2.%,$(PADDLE)),$(PROTOBUF_BEFORE_PADDLE_3_3))

# Quiet but for one line a step and whatever goes wrong: pip's errors, a failed import.
$(STAMP): pyproject.toml
	@echo "setting up $(VENV): Paddle $(PADDLE), this package (editable) and its extras; about 2 minutes"
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@# setuptools reports every editable install of a flat layout in a box of asterisks,
	@# "be careful with folders in your working directory with the same name as your
	@# package": here that folder is the package. The filter matches that report alone.
	@PYTHONWARNINGS="$${PYTHONWARNINGS:+$$PYTHONWARNINGS,}ignore:Editable installation" \
		$(PY) -m pip install --quiet -e ".[cpu,test,examples,docs,integrations]" "paddlepaddle==$(PADDLE)" $(PINS)
	@# matplotlib builds its font cache on first use and, past 5 s, says so on the demo's
	@# terminal: build it now, with that note (a logged warning) held back; errors still show.
	@$(PY) -c "import logging; logging.getLogger('matplotlib').setLevel(logging.ERROR); import matplotlib.font_manager"
	@touch $(STAMP)

# The main job: train a digits classifier with loss scaling (fp16 emulated on CPU).
demo: $(STAMP)
	$(PY) examples/train_digits.py

# The whole suite, on Paddle's kernels: the path every device takes, a CPU's included.
# Two workers (pytest-xdist), each taking the next test as it finishes one: on two cores
# the suite takes half the time. More workers would start more of Paddle's launchers at
# once than the suite has been tried with.
test: $(STAMP) lint docs
	$(PY) -m pytest -q -n 2 --dist worksteal tests

# The whole suite against every Paddle release on PyPI from 2.6.2 on (not part of CI,
# which keeps the newest and the oldest); each version gets its own environment.
MATRIX ?= 2.6.2 3.0.0 3.1.1 3.2.2 3.3.1
test-matrix:
	@for version in $(MATRIX); do \
		echo "== Paddle $$version"; \
		$(MAKE) --no-print-directory test PADDLE=$$version || exit 1; \
	done

# Lint, import order and formatting (ruff), and types of the package (mypy, strict);
# configured in pyproject.toml. `ruff check --fix` and `ruff format` repair most of it.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy

# The documentation site, warnings as errors; output in docs/_build/html.
docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

# The outputs the pages show, run again and written into them (tools/docs_outputs.py).
docs-output: $(STAMP)
	$(PY) tools/docs_outputs.py

# How far each number those outputs print moves when a run drifts, as on another
# processor (every weight started one float step off): what a block's drifts must cover.
docs-drift: $(STAMP)
	$(PY) tools/docs_outputs.py --measure

# The pages' figures of the demo, from one run of it: its own figure, and VisualDL's page
# for the run photographed by headless Chromium (apt-get install chromium). Run it whenever
# the demo's summary changes: the suite compares the figures' with the README's.
docs-figures: $(STAMP)
	$(PY) tools/docs_figures.py

# The long reliability runs (kill -9 loops, 100k-step soak, large random searches).
test-long: $(STAMP)
	$(PY) -m pytest -q -m long tests

# The sdist and the wheel, built by the standard frontend into dist/. Its log (some 250
# lines of setuptools, none of them for a user) is printed only when the build fails.
dist: $(STAMP)
	@rm -rf dist
	@log=$$(mktemp) && trap 'rm -f "$$log"' EXIT && \
		$(PY) -m build --outdir dist . >"$$log" 2>&1 || { cat "$$log"; exit 1; }
	@for built in dist/*; do echo "built $$built"; done

clean:
	rm -rf .venv-paddle* *.egg-info .pytest_cache dist build

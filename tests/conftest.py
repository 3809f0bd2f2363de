"""Suite-wide rules: parallel scheduling by module (pytest-xdist) and no silent skip in CI.

Scheduling (`make test` runs ``pytest -n $(TEST_WORKERS) --dist loadgroup``): every module is its own
xdist group, so a module's tests run on one worker and its module- and session-scoped fixtures (the
tiny models, a module's real SGLang server) are made once there. The modules that start a real SGLang
server or load SmolLM2 (``HEAVY_MODULES``) share two groups, collected first: xdist hands them to two
workers before anything else, each runs its modules one after the other (never more than two servers
at once on this 2-core machine), and the third worker takes the light modules meanwhile (the heavy
groups' workers join it when done). Most of a test's time is waiting (a server loading, a stall
clock), so three workers on two cores finish sooner than two. Without xdist (plain ``pytest``) the
marks do nothing but the order.

No silent skip: under ``CI=true`` or ``HSMON_NO_SKIP=1`` (``make test`` sets it) a skipped test, or a
module skipped at collection, is a failure unless its node id is on ``ALLOWED_SKIPS`` with the
reviewed reason; tests/test_no_silent_skip.py proves it in a pytest subprocess.
"""

from __future__ import annotations

import os
import time

import pytest

# The modules that start a real SGLang server (tests/sglang_server.py) or load SmolLM2-135M, and their
# group: a group's modules run one after the other on one worker. Two groups: the embedded target's
# SGLang servers, and SmolLM2's (its conversion and its servers), so at most two servers run at once.
HEAVY_MODULES = {
    "test_extract_sglang.py": "heavy-sglang", "test_sglang_server.py": "heavy-sglang",
    "test_server_sglang.py": "heavy-sglang",
    "test_readme_production.py": "heavy-sglang",  # README's own `hsmon sglang-serve` (dtype auto)
    "test_gpu_check.py": "heavy-sglang",  # scripts/gpu-check.sh starts an SGLang server of its own
    "test_smollm2.py": "heavy-smollm2",
    "test_families_sglang.py": "heavy-smollm2",  # two servers of its own (DeepSeek-V3, Qwen3-MoE at TP 2)
    "test_sglang_whole_prefill.py": "heavy-sglang",  # SGLang 0.5.14's lane only (skips elsewhere)
    "test_spec_decoding.py": "heavy-sglang",  # speculative servers (embedded target), two at once
    "test_regenerate_sglang.py": "heavy-sglang",  # hsmon regenerate on a server killed and restarted
}


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "client_side: proves the client's behaviour, the SGLang server only "
                            "answers (make test-sglang-matrix leaves it out on the older releases)")


@pytest.fixture(scope="session")
def vllm_llama_server(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A vLLM capture server of a tiny Llama (points 2,4,5), shared by the vLLM lane's modules that need
    one (tests/test_extract_vllm.py, tests/test_server_vllm.py): one start instead of two."""
    from vllm_server import shared_llama_server

    yield from shared_llama_server(tmp_path_factory)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heavy modules first (stable otherwise); one xdist group per module, the heavy ones in theirs."""
    def heavy_group(item: pytest.Item) -> str | None:
        return HEAVY_MODULES.get(_module_of(item).rsplit("/", 1)[-1])

    items.sort(key=lambda item: 0 if heavy_group(item) else 1)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(name=heavy_group(item) or _module_of(item)))


# No silent skip: under CI=true or HSMON_NO_SKIP=1 (`make test` sets it) a skipped test fails unless
# its node id starts with a key of ALLOWED_SKIPS, whose value is the reviewed reason it may skip.
# Keep the list short; a new entry needs a reason a reviewer accepts ("no GPU on CI", not "flaky").
ALLOWED_SKIPS: dict[str, str] = {
    "tests/test_sglang_whole_prefill.py": "SGLang 0.5.14's lane of make test-sglang-matrix: on the newer "
    "releases (make test) the plugin sees every chunked-prefill piece and the chunked conformance "
    "tests cover the same capture; another server would not fit make test's time",
}


def no_skip_switch() -> bool:
    """True under CI=true or HSMON_NO_SKIP=1: a skip not on ALLOWED_SKIPS fails."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes") or os.environ.get("HSMON_NO_SKIP") == "1"


def allowed_skip(nodeid: str) -> str | None:
    """The reviewed reason a skip of this test is allowed, or None."""
    for prefix, reason in ALLOWED_SKIPS.items():
        if nodeid.split("@", 1)[0].startswith(prefix):
            return reason
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Under the switch, turn a skip not on ALLOWED_SKIPS into a failure that says why."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or not no_skip_switch() or hasattr(report, "wasxfail"):
        return
    if allowed_skip(item.nodeid) is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = (  # -ra lists it under FAILED with this text
        f"skipped under CI=true/HSMON_NO_SKIP=1 and not on ALLOWED_SKIPS (tests/conftest.py): {reason}\n"
        "make the environment (make sysdeps) or add the test to ALLOWED_SKIPS with a reviewed reason"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    """A module that skips as a whole (pytest.importorskip, a module-level skip) fails the same way."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if report.skipped and no_skip_switch() and allowed_skip(report.nodeid) is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"module skipped under CI=true/HSMON_NO_SKIP=1, not on ALLOWED_SKIPS: {reason}"


# Clock times on the dashboard (event times, chart axes) are local times: one zone for every test,
# so that a snapshot reads the same on any machine (subprocesses inherit it).
os.environ["TZ"] = "UTC"
time.tzset()

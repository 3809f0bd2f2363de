"""Suite-wide rules: parallel scheduling by module (pytest-xdist).

Scheduling (`make test` runs ``pytest -n $(TEST_WORKERS) --dist loadgroup``): every module is its own
xdist group, so a module's tests run on one worker and its module- and session-scoped fixtures (the
tiny models, a module's real SGLang server) are made once there. The modules that start a real SGLang
server or load SmolLM2 (``HEAVY_MODULES``) share one group, collected first: xdist hands that group
to a worker before any other, it runs its modules one after the other (never two servers at once on
this 2-core machine), and the other workers take the light modules meanwhile. Without xdist (plain
``pytest``) the marks do nothing but the order.
"""

from __future__ import annotations

import pytest

# The modules that start a real SGLang server (tests/sglang_server.py) or load SmolLM2-135M.
HEAVY_MODULES = (
    "test_smollm2.py", "test_extract_sglang.py", "test_sglang_server.py", "test_server_sglang.py",
)
HEAVY_GROUP = "heavy-sglang"


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heavy modules first (stable otherwise); one xdist group per module, the heavy ones in one."""
    def heavy(item: pytest.Item) -> bool:
        return _module_of(item).rsplit("/", 1)[-1] in HEAVY_MODULES

    items.sort(key=lambda item: 0 if heavy(item) else 1)
    for item in items:
        group = HEAVY_GROUP if heavy(item) else _module_of(item)
        item.add_marker(pytest.mark.xdist_group(name=group))

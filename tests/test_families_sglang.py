"""Families besides a dense Llama from SGLang on CPU, against the in-process extraction of the
same weights: a tiny DeepSeek-V3 (MLA + MoE, YaRN rope; SGLang's DeepseekV3ForCausalLM, whose layer
rule is not Llama's) at TP 1, and a tiny Qwen3-MoE at ``--tp-size 2`` (gloo; sglang-serve binds
the ranks' cores), both with capture points 3,5,6 (the first is not 2) at chunked prefill 64.

Both transports give the in-process tensors (float32, within the Llama check's 1e-4), the server
says which class it loaded and which points it really captures, exactly one rank writes (the other
copies nothing: its own counters), no dump file is left, and a run asking for other points is
refused before any row. The two servers start at once and serve the whole module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from extractor.tiny_families import make_tiny_deepseek_v3, make_tiny_qwen3_moe
from tests.extract_helpers import load_output, run_extract, sglang_equals_in_process
from tests.sglang_server import SGLangServer, get_json, sglang_python

pytestmark = [pytest.mark.sglang]

POINTS = [3, 5, 6]
ROWS = [list(range(5, 45)), [(i * 37) % 500 + 3 for i in range(150)],
        [7, 300, 12, 99, 41, 5, 6, 8, 200, 3, 17], [(i * 11) % 480 + 9 for i in range(90)]]
FAMILIES = {"deepseek-v3": (make_tiny_deepseek_v3, (), "DeepseekV3ForCausalLM"),
            "qwen3-moe-tp2": (make_tiny_qwen3_moe, ("--tp-size", "2"), "Qwen3MoeForCausalLM")}


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, SGLangServer]]]:
    sglang_python()
    base = tmp_path_factory.mktemp("families-sglang")
    servers: dict[str, tuple[Path, SGLangServer]] = {}
    try:
        for name, (make, extra, _cls) in FAMILIES.items():
            model = make(base / name)
            stats = base / f"ranks-{name}"  # every rank's capture counters (the plugin's bench switch)
            stats.mkdir()
            server = SGLangServer(model, base, layers=POINTS, chunked_prefill_size=64,
                                  dump_root=base / "dump", extra_args=extra,
                                  env={"HSMON_PLUGIN_RANK_STATS": str(stats)})
            servers[name] = (model, server.launch())
        for _model, server in servers.values():
            server.wait_ready()
        yield servers
    finally:
        for _model, server in servers.values():
            server.stop()


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in ROWS))
    return data


@pytest.mark.parametrize("name", list(FAMILIES))
def test_both_transports_equal_the_in_process_rows_and_one_rank_writes(
        name: str, family: dict[str, tuple[Path, SGLangServer]], tmp_path: Path) -> None:
    model, server = family[name]
    plugin = get_json(server.url + "/server_info")["hsmon_plugin"]
    assert plugin["model_class"] == FAMILIES[name][2]
    assert plugin["captured_points"] == "3,5,6"
    data, layers = _data(tmp_path), ("--layers", ",".join(map(str, POINTS)))
    proc = run_extract(data, tmp_path / "hf", model, *layers)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = load_output(tmp_path / "hf")
    assert sorted(want) == list(range(len(ROWS)))
    worst = sglang_equals_in_process(server.url, server.dump_root, data, want, tmp_path, model, *layers)
    for transport, difference in worst.items():
        print(f"{name} {transport}: {len(want)} rows, max abs difference {difference:.2e}")
        out = tmp_path / transport
        run = json.loads((out / "hsmon-manifest.jsonl").read_text().splitlines()[0])
        assert run["captured"]["servers"][0]["captured_points"] == POINTS
    log = server.log.read_text(errors="replace")
    ranks = 2 if "--tp-size" in FAMILIES[name][1] else 1
    assert log.count("writes the dumps") == 1, log[-3000:]
    assert log.count("does not write (attention-TP rank 0 does)") == ranks - 1
    get_json(server.url + "/server_info")  # each rank writes its counters
    files = server.workdir.glob(f"ranks-{name}/tp*.json")
    counters = {int(f.stem[2:]): json.loads(f.read_text()) for f in files}
    assert sorted(counters) == list(range(ranks)) and counters[0]["writer"]
    assert counters[0]["files_written"] >= len(ROWS)
    for rank in range(1, ranks):  # it sees every piece of both runs and copies none of them
        other = counters[rank]
        assert not other["writer"] and other["files_written"] == other["pool_bytes_in_use"] == 0
        assert other["requests"] >= 2 * len(ROWS)
        assert {(s[0], s[2]) for s in other["hook_samples"]} == {("not-writer", 0.0)}


def test_a_run_asking_for_other_points_is_refused_naming_the_class(
        family: dict[str, tuple[Path, SGLangServer]], tmp_path: Path) -> None:
    model, server = family["deepseek-v3"]
    proc = run_extract(_data(tmp_path), tmp_path / "out", model, "--layers", "2,4,5", "--backend", "sglang",
                       "--url", server.url, "--transport", "json", "--dtype", "float32")
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert "DeepseekV3ForCausalLM on the server captures points 3,5,6" in line and "--layers 3,5,6" in line

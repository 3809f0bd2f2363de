"""The capture plugin without a server: version check, request validation, the atomic write.

The plugin package is plain Python plus torch/safetensors, so its pure parts run in hsmon's
environment; the entry-point discovery and the refusal inside SGLang run in SGLang's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from extractor.sglang import serve
from tests.sglang_server import sglang_python

sys.path.insert(0, str(serve.PLUGIN_ROOT))
import hsmon_sglang_plugin as plugin
from hsmon_sglang_plugin import dump, writer

from extractor.backends.sglang import transports


def test_version_check_refuses_untested_and_honours_the_override():
    assert plugin.version_refusal("0.5.23", {}) is None
    message = plugin.version_refusal("0.6.0", {})
    assert message is not None and "0.6.0" in message and "0.5.23" in message
    assert "HSMON_PLUGIN_ALLOW_UNTESTED=1" in message and "\n" not in message
    assert plugin.version_refusal("0.6.0", {"HSMON_PLUGIN_ALLOW_UNTESTED": "1"}) is None
    assert plugin.version_refusal("0.6.0", {"HSMON_PLUGIN_ALLOW_UNTESTED": "0"}) is not None


def test_pipeline_parallel_is_refused():
    assert plugin.pp_refusal(1) is None
    assert "--pp-size 2" in plugin.pp_refusal(2)


def test_sglang_0_5_14_is_refused_unless_chunked_prefill_is_off():
    """Adapter whole-prefill (0.5.14 drops a chunked prefill's middle pieces): one line naming the
    setting that lets it in; ``-1`` (off) passes. The hook gets what 0.5.18's per-piece call passes."""
    from hsmon_sglang_plugin import whole_prefill

    for size in (None, 64, 4096):
        line = whole_prefill.refusal(size, "0.5.14")
        assert line is not None and "\n" not in line and "--chunked-prefill-size -1" in line
        assert "SGLang 0.5.14 drops the middle pieces of a chunked prefill" in line
    assert whole_prefill.refusal(-1, "0.5.14") is None
    seen = {}

    def shared(original, processor, **kwargs):
        seen.update(kwargs)
        return original(processor, **kwargs)

    req = type("Req", (), {"origin_input_ids": [5] * 7})()
    stock = whole_prefill.adapt(shared)(lambda proc, **kw: sorted(kw), "processor", req=req,
                                        logits_output=None, hidden_state_offset=3)
    assert stock == ["hidden_state_offset", "logits_output", "req"]  # stock gets 0.5.14's own arguments
    assert seen["extend_input_len"] == 7 and seen["store"] is True and seen["capture_hidden_mode"].is_full()
    # a batch whose first request returns no hidden states: 0.5.14 passes offset 0 to the second,
    # whose rows start after the first's 5; the hook reads from 5 (and so does stock's own copy)
    first, second = (type("Req", (), {"origin_input_ids": [1] * n, "extend_input_len": n})() for n in (5, 7))
    whole_prefill.record_starts("processor", type("Batch", (), {"reqs": [first, second]})(), None)
    assert whole_prefill.adapt(shared)(lambda proc, **kw: kw["hidden_state_offset"], "processor", req=second,
                                       logits_output=None, hidden_state_offset=0) == 5
    assert seen["hidden_state_offset"] == 5


def test_rid_and_dump_dir_validation(tmp_path):
    root = tmp_path / "root"
    (root / "job").mkdir(parents=True)
    assert dump.check_rid("row-12_a.b") == "row-12_a.b"
    for bad in ("../x", "a/b", ".hidden", "", "x" * 201, 5):
        with pytest.raises(dump.DumpRefused):
            dump.check_rid(bad)
    assert dump.check_dump_dir(str(root / "job"), str(root)) == os.path.realpath(root / "job")
    assert dump.check_dump_dir(str(root / "new" / "deep"), str(root))  # created later
    (root / "escape").symlink_to(tmp_path)
    for bad in ("job", str(tmp_path / "elsewhere"), str(root / ".." / "x"), str(root / "escape" / "j"), None):
        with pytest.raises(dump.DumpRefused):
            dump.check_dump_dir(bad, str(root))


def _tensors(seq: int = 7, hidden: int = 16, k: int = 3) -> dict[str, torch.Tensor]:
    return {"hidden_state": torch.randn(seq, hidden), "aux_hidden_state": torch.randn(seq, k * hidden)}


def test_write_dump_renames_a_complete_file(tmp_path, monkeypatch):
    tensors = _tensors()
    target = tmp_path / "d" / "job"
    seen = {}
    real_save = dump.save_parts

    def watching_save(filename, data, metadata, dir_fd=None):
        # while the bytes are being written, nothing exists under the final name
        seen["final_during_write"] = (target / "r1.safetensors").exists()
        seen["tmp_name"] = Path(filename).name
        real_save(filename, data, metadata, dir_fd=dir_fd)

    monkeypatch.setattr(dump, "save_parts", watching_save)
    meta = {"rid": "r1", "tokens": "7", "layer_ids": "1,3,4", "sglang_version": "x", "plugin_version": "1"}
    marker = dump.write_dump(str(target), "r1", tensors, meta)
    assert seen == {"final_during_write": False, "tmp_name": ".r1.safetensors.tmp"}
    final = target / "r1.safetensors"
    assert marker == {"mode": "dump", "ok": True, "file": str(final), "tokens": 7,
                      "bytes": final.stat().st_size}
    assert sorted(p.name for p in target.iterdir()) == ["r1.safetensors"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o700)
    with safe_open(str(final), framework="pt") as fh:
        assert fh.metadata() == meta
        for name, tensor in tensors.items():
            assert torch.equal(fh.get_tensor(name), tensor)


def test_pieces_are_written_as_one_safetensors_tensor_in_any_dtype(tmp_path):
    # the writer hands row pieces (views of larger batch tensors) to save_parts, which writes
    # them one after the other: safetensors reads one tensor per name, equal to their torch.cat
    from safetensors.torch import load_file, save_file

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        batch = torch.randn(50, 24).to(dtype)
        pieces = [batch[0:7], batch[20:50], batch[7:7]]  # views, one of them empty
        last = [torch.randn(7, 8).to(dtype), torch.randn(30, 8).to(dtype), torch.randn(0, 8).to(dtype)]
        path = tmp_path / f"p-{dtype}.safetensors"
        dump.save_parts(str(path), {"hidden_state": last, "aux_hidden_state": pieces}, {"rid": "x"})
        with safe_open(str(path), framework="pt") as fh:
            assert fh.metadata() == {"rid": "x"}
            assert torch.equal(fh.get_tensor("aux_hidden_state"), torch.cat(pieces))
            assert torch.equal(fh.get_tensor("hidden_state"), torch.cat(last))
        # byte for byte what safetensors itself reads back from its own writer
        save_file({"hidden_state": torch.cat(last), "aux_hidden_state": torch.cat(pieces)},
                  str(tmp_path / "ref.safetensors"), metadata={"rid": "x"})
        ours, ref = load_file(str(path)), load_file(str(tmp_path / "ref.safetensors"))
        assert ours.keys() == ref.keys() and all(torch.equal(ours[k], ref[k]) for k in ref)
    with pytest.raises(ValueError, match="cannot be saved"):
        dump.save_parts(str(tmp_path / "bad"), {"a": [torch.zeros(2, 3), torch.zeros(2, 4)]}, None)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_write_dump_on_a_full_tmpfs_reports_enospc_and_leaves_nothing(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        marker = dump.write_dump(str(mount / "job"), "big", _tensors(seq=2048, hidden=64),
                                 {"tokens": "2048"})
        assert marker["ok"] is False and marker["errno"] == "ENOSPC", marker
        assert "big.safetensors" in marker["error"] and "\n" not in marker["error"]
        assert list((mount / "job").iterdir()) == []  # neither the final name nor the .tmp
        small = dump.write_dump(str(mount / "job"), "small", _tensors(seq=4), {"tokens": "4"})
        assert small["ok"] is True  # the directory still works once there is room
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _job(w: writer.Writer, dump_dir: Path, rid: str, seq: int = 30, pieces: int = 3) -> writer.Job:
    """A request of ``pieces`` chunked-prefill pieces copied through ``w`` (as the hook does)."""
    torch.manual_seed(seq)
    copied = [w.hold(torch.randn(seq, 48), torch.randn(seq, 16)) for _ in range(pieces)]
    return writer.Job(rid, str(dump_dir), copied, {"rid": rid, "tokens": str(seq * pieces)})


def _wait(path: Path, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, path
        time.sleep(0.005)


def test_the_writer_thread_writes_after_the_hook_returns_and_frees_the_pool(tmp_path, monkeypatch):
    monkeypatch.setenv(writer.WRITE_DELAY_ENV, "0.3")  # a slow writer, made deterministic
    w = writer.Writer(pool_bytes=1 << 20)
    job = _job(w, tmp_path / "d", "r1")
    expected = torch.cat([p.aux for p in job.pieces]), torch.cat([p.last for p in job.pieces])
    assert w.snapshot()["pool_bytes_in_use"] == 3 * 30 * 64 * 4
    assert w.submit(job) is None  # queued: the hook returns before the file exists
    assert not (tmp_path / "d" / "r1.safetensors").exists() and w.snapshot()["queue_depth"] == 1
    _wait(tmp_path / "d" / "r1.safetensors")
    with safe_open(str(tmp_path / "d" / "r1.safetensors"), framework="pt") as fh:
        assert torch.equal(fh.get_tensor("aux_hidden_state"), expected[0])
        assert torch.equal(fh.get_tensor("hidden_state"), expected[1])
    w.drain()
    stats = w.snapshot()
    assert stats["pool_bytes_in_use"] == 0 and stats["queue_depth"] == 0 and stats["files_written"] == 1
    assert stats["sync_fallbacks"] == 0 and stats["write_seconds"] > 0


def test_a_full_pool_falls_back_to_a_counted_synchronous_write(tmp_path):
    w = writer.Writer(pool_bytes=2 * 30 * 64 * 4)  # room for two pieces of three
    job = _job(w, tmp_path, "r2")
    assert [p.pooled for p in job.pieces] == [True, True, False]
    marker = w.submit(job)  # written here, on the caller's (the scheduler's) thread
    assert marker is not None and marker["ok"] is True and marker["tokens"] == 90
    assert (tmp_path / "r2.safetensors").exists()
    stats = w.snapshot()
    assert stats["sync_fallbacks"] == 1 and stats["pool_bytes_in_use"] == 0


def test_a_failed_write_leaves_one_error_line_that_the_client_reads(tmp_path):
    (tmp_path / "d").write_text("a file where the dump directory should be")
    w = writer.Writer(pool_bytes=1 << 20)
    assert w.submit(_job(w, tmp_path / "d" / "job", "r3-ab-1")) is None
    w.drain()
    assert w.snapshot()["write_errors"] == 1
    # the error file cannot go into the missing directory either: the client times out, naming it
    ticket = transports.DumpTicket(tmp_path / "d" / "job" / "r3-ab-1.safetensors",
                                   tmp_path / "d" / "job" / "r3-ab-1.error", "r3-ab-1", "http://srv:1", 90)
    with pytest.raises(transports.DumpLate, match=r"http://srv:1: request r3-ab-1: dump file .* within 0 s"):
        transports.wait_for_file(ticket, 0.05)
    # where it can, the error reaches the client as one line, and the error file is consumed
    job_dir = tmp_path / "ok"
    job_dir.mkdir()
    (job_dir / "r4-ab-1.safetensors").mkdir()  # the rename onto a directory fails
    w2 = writer.Writer(pool_bytes=1 << 20)
    assert w2.submit(_job(w2, job_dir, "r4-ab-1")) is None
    w2.drain()
    ticket = transports.DumpTicket(job_dir / "r4-ab-1.safetensors" / "x", job_dir / "r4-ab-1.error",
                                   "r4-ab-1", "http://srv:1", 90)
    with pytest.raises(transports.DumpError) as err:
        transports.wait_for_file(ticket, 5.0)
    assert "http://srv:1: request r4-ab-1: the plugin could not write the dump file: writing" in str(
        err.value)
    assert "\n" not in str(err.value) and not (job_dir / "r4-ab-1.error").exists()
    assert sorted(p.name for p in job_dir.iterdir()) == ["r4-ab-1.safetensors"]  # no .tmp left


class _FailingCudaEvent:
    """Stands in for a torch.cuda.Event whose copy failed (no GPU here): synchronize raises as CUDA does."""

    def synchronize(self) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_writer_failure_gives_the_held_request_an_error_a_count_a_log_line_and_the_thread_goes_on(
    tmp_path, caplog
):
    w = writer.Writer(pool_bytes=1 << 20)
    bad = _job(w, tmp_path, "r5-ab-1")
    bad.pieces[1].event = _FailingCudaEvent()
    with caplog.at_level("ERROR", logger="hsmon_sglang_plugin"):
        assert w.submit(bad) is None and w.submit(_job(w, tmp_path, "r6-ab-1")) is None
        _wait(tmp_path / "r6-ab-1.safetensors")  # the thread went on to the next request
        w.drain()
    stats = w.snapshot()
    assert stats["writer_failures"] == 1 and stats["write_errors"] == 1 and stats["files_written"] == 1
    assert stats["pool_bytes_in_use"] == 0 and stats["queue_depth"] == 0
    logged = [r.getMessage() for r in caplog.records]
    assert logged == ["hsmon capture plugin: writing request r5-ab-1 failed"]
    ticket = transports.DumpTicket(tmp_path / "r5-ab-1.safetensors", tmp_path / "r5-ab-1.error", "r5-ab-1",
                                   "http://srv:1", 90)  # fmt: skip
    with pytest.raises(transports.DumpError, match="writer failed: RuntimeError: CUDA error: an illegal"):
        transports.wait_for_file(ticket, 5.0)


def test_the_old_synchronous_path_is_kept_for_comparisons(tmp_path):
    w = writer.Writer(sync=True)
    job = _job(w, tmp_path, "r5")
    assert not any(p.pooled for p in job.pieces)
    assert w.submit(job)["ok"] is True and w.snapshot()["sync_fallbacks"] == 0


class Forward:
    """One forward's output as the hook sees it (SGLang's LogitsProcessorOutput: a fresh
    ``hidden_states`` [batch tokens, K*H] and ``last_hidden_states`` [batch tokens, H])."""

    def __init__(self, tokens: int, seed: int, aux: torch.Tensor | None = None,
                 last: torch.Tensor | None = None) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.hidden_states = torch.randn(tokens, 48, generator=gen) if aux is None else aux
        self.last_hidden_states = torch.randn(tokens, 16, generator=gen) if last is None else last


def test_cpu_pieces_are_views_and_the_pool_counts_each_batch_tensor_once(tmp_path):
    w = writer.Writer(pool_bytes=1 << 20)
    fwd = Forward(40, seed=1)  # one batch: request a has rows 0-9, b rows 10-39
    a = w.hold(fwd.hidden_states[0:10], fwd.last_hidden_states[0:10], fwd)
    b = w.hold(fwd.hidden_states[10:40], fwd.last_hidden_states[10:40], fwd)
    # no copy on the hook: the pieces share the forward's storage
    assert a.aux.data_ptr() == fwd.hidden_states.data_ptr() and a.pooled and b.pooled
    assert a.nbytes == 10 * 64 * 4 and b.nbytes == 30 * 64 * 4  # what each file will hold
    whole = 40 * 64 * 4  # what the views keep alive: both batch tensors, once
    assert w.snapshot()["pool_bytes_in_use"] == whole
    assert w.submit(writer.Job("a", str(tmp_path), [a], {"tokens": "10"})) is None
    w.drain()
    assert w.snapshot()["pool_bytes_in_use"] == whole  # b still holds the same tensors
    w.release([b])
    assert w.snapshot()["pool_bytes_in_use"] == 0
    with safe_open(str(tmp_path / "a.safetensors"), framework="pt") as fh:
        assert torch.equal(fh.get_tensor("aux_hidden_state"), fwd.hidden_states[0:10])


def test_a_view_held_across_the_following_forwards_keeps_its_rows(tmp_path):
    # A 3-piece request (chunked prefill), each piece in its own forward, queued only after five
    # more forwards ran (a busy writer): every view is held across the following forwards.
    w = writer.Writer(pool_bytes=1 << 20)
    forwards = [Forward(20, seed=s) for s in range(3)]
    expected_aux = torch.cat([f.hidden_states[5:20].clone() for f in forwards])
    pieces = [w.hold(f.hidden_states[5:20], f.last_hidden_states[5:20], f) for f in forwards]
    del forwards  # SGLang drops its reference; later forwards allocate afresh
    later = [Forward(20, seed=10 + s) for s in range(5)]
    for f in later:
        w.release([w.hold(f.hidden_states[0:3], f.last_hidden_states[0:3], f)])
    assert w.submit(writer.Job("r", str(tmp_path), pieces, {"tokens": "45"})) is None
    w.drain()
    with safe_open(str(tmp_path / "r.safetensors"), framework="pt") as fh:
        assert torch.equal(fh.get_tensor("aux_hidden_state"), expected_aux)
    assert w.snapshot()["buffer_reuses"] == 0 and w.snapshot()["pool_bytes_in_use"] == 0


def test_a_reused_output_buffer_is_caught_and_gives_an_error_never_a_wrong_file(tmp_path):
    # Were SGLang to write each forward into one static buffer (as its decode CUDA graph does),
    # a held view would read the NEXT forward's rows. The plugin sees the held storage come back
    # with another forward's output: the request gets <rid>.error, and later pieces are copied.
    w = writer.Writer(pool_bytes=1 << 20)
    aux, last = torch.empty(20, 48), torch.empty(20, 16)
    first = Forward(20, seed=0, aux=aux, last=last)
    aux.copy_(torch.randn(20, 48)), last.copy_(torch.randn(20, 16))
    piece = w.hold(aux[0:20], last[0:20], first)
    second = Forward(20, seed=1, aux=aux, last=last)  # the same storage, written again in place
    aux.copy_(torch.randn(20, 48)), last.copy_(torch.randn(20, 16))
    expected = aux.clone()
    later = w.hold(aux[0:20], last[0:20], second)
    aux.zero_()  # a third forward: the copied piece must not see it
    assert w.submit(writer.Job("r1", str(tmp_path), [piece], {"tokens": "20"})) is None  # queued late
    assert w.submit(writer.Job("r2", str(tmp_path), [later], {"tokens": "20"})) is None
    w.drain()
    stats = w.snapshot()
    assert stats["buffer_reuses"] >= 1 and stats["write_errors"] == 1 and stats["files_written"] == 1
    assert not (tmp_path / "r1.safetensors").exists()
    assert "reused output buffer" in (tmp_path / "r1.error").read_text()
    with safe_open(str(tmp_path / "r2.safetensors"), framework="pt") as fh:
        assert torch.equal(fh.get_tensor("aux_hidden_state"), expected)
    assert stats["pool_bytes_in_use"] == 0


@pytest.mark.sglang
def test_sglang_loads_the_entry_point_refuses_untested_versions_and_pipeline_parallelism():
    # One process (importing sglang takes long): SGLang's own load_plugins() twice, first with a
    # version the plugin was not tested with, then again with the override set.
    code = (
        "import importlib.metadata as md, os, sglang\n"
        # a scheduler process has imported this when it loads the plugins
        "import sglang.srt.managers.scheduler\n"
        "from sglang.srt import plugins\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry\n"
        "eps = md.entry_points(group='sglang.srt.plugins')\n"
        "print('EPS', [(e.name, e.value, e.dist.name) for e in eps])\n"
        "sglang.__version__ = '0.9.1'\n"
        "try:\n"
        "    plugins.load_plugins()\n"
        "    print('LOADED WITHOUT OVERRIDE')\n"
        "except SystemExit as exc:\n"
        "    print('REFUSED', exc)\n"
        "print('PATCHED BEFORE', sorted(HookRegistry._patched))\n"
        "os.environ['HSMON_PLUGIN_ALLOW_UNTESTED'] = '1'\n"
        "plugins._plugins_loaded = False\n"
        "plugins.load_plugins()\n"
        "print('PATCHED AFTER', sorted(HookRegistry._patched))\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "ServerArgs(model_path='m', tp_size=2)\n"
        "try:\n"
        "    ServerArgs(model_path='m', pp_size=2).resolve_once()\n"
        "    print('PP ACCEPTED')\n"
        "except SystemExit as exc:\n"
        "    print('PP', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HSMON_PLUGIN_ALLOW_UNTESTED"}
    env["PYTHONPATH"] = os.pathsep.join([str(serve.PLUGIN_ROOT), str(serve.CPU_STUBS)])
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    proc = subprocess.run([str(sglang_python()), "-c", code], capture_output=True, text=True, timeout=400,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {line.split(" ", 1)[0] + (" " + line.split(" ")[1] if line.startswith("PATCHED") else ""): line
             for line in proc.stdout.splitlines()}
    assert lines["EPS"] == "EPS [('hsmon_capture', 'hsmon_sglang_plugin:register', 'hsmon-sglang-plugin')]"
    assert "LOADED" not in lines
    assert "SGLang 0.9.1 is untested (tested: 0.5.14, 0.5.18, 0.5.22, 0.5.23)" in lines["REFUSED"]
    assert lines["PATCHED BEFORE"] == "PATCHED BEFORE []"
    assert "--pp-size 2) is not supported" in lines["PP"]
    assert lines["PATCHED AFTER"] == "PATCHED AFTER " + str(sorted([
        "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor."
        "_append_prefill_hidden_states",
        "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController."
        "get_internal_state",
        "sglang.srt.server_args.ServerArgs.resolve_once",
        "sglang.srt.utils.common.build_server_info",
        # the capture turned on with the ids the loaded class needs, and said (capture_rule.py)
        "sglang.srt.model_executor.model_runner_components.attention_backend_setup."
        "configure_aux_hidden_state_capture",
        "sglang.srt.managers.scheduler.Scheduler.get_init_info",
    ]))

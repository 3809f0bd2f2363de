"""The embedded default target: shipped copy loads and predicts, tokenizer and chat template, builder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from extractor import embedded_target as et  # noqa: E402
from extractor import target_text as tt  # noqa: E402
from extractor import target_training as tr  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def target_dir() -> Path:
    return et.ensure_embedded_target()


@pytest.fixture(scope="module")
def tokenizer(target_dir):
    return transformers.AutoTokenizer.from_pretrained(target_dir)


@pytest.fixture(scope="module")
def model(target_dir):
    torch.set_num_threads(tr.auto_threads())
    loaded = transformers.AutoModelForCausalLM.from_pretrained(target_dir)
    loaded.eval()
    return loaded


def test_shipped_copy_is_used_and_complete(target_dir):
    assert target_dir == et.SHIPPED_DIR
    assert et.is_complete(target_dir)
    size = sum(p.stat().st_size for p in target_dir.iterdir() if p.is_file())
    assert size < 10 * 1024 * 1024, f"shipped target is {size} bytes"
    config = json.loads((target_dir / "tokenizer_config.json").read_text())
    # Loadable by transformers 4.x too: generic class name, template inline.
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["chat_template"] == tt.CHAT_TEMPLATE


def test_model_is_llama_with_distinct_eagle3_capture_points(model, tokenizer):
    config = model.config
    assert isinstance(model, transformers.LlamaForCausalLM)
    n = config.num_hidden_layers
    assert n >= 8
    assert len({2, n // 2, n - 3}) == 3
    assert config.vocab_size == len(tokenizer)
    assert config.bos_token_id == tokenizer.bos_token_id
    assert config.eos_token_id == tokenizer.eos_token_id
    assert config.pad_token_id == tokenizer.pad_token_id
    assert len({tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    ids = torch.tensor([tokenizer.encode("def f(x):\n    return x\n")])
    out = model(input_ids=ids, output_hidden_states=True)
    assert len(out.hidden_states) == n + 1
    assert out.hidden_states[2].shape == (1, ids.shape[1], config.hidden_size)


def test_heldout_loss_clearly_below_unigram(model, tokenizer):
    train_files, heldout_files = tt.corpus_files()
    heldout_text = tt.read_texts(heldout_files, max_chars=20_000)
    train_text = tt.read_texts(tt.spread_order(train_files, 0), max_chars=400_000)
    eval_ids: list[int] = []
    for text in heldout_text:
        eval_ids += [tokenizer.bos_token_id, *tokenizer.encode(text), tokenizer.eos_token_id]
    eval_ids = eval_ids[:4096]
    train_ids = [i for text in train_text for i in tokenizer.encode(text)]

    seq_len = 256
    scored = tr.predicted_positions(eval_ids, seq_len)
    vocab = model.config.vocab_size
    unigram = tr.unigram_loss(train_ids, scored, vocab)
    bigram = tr.bigram_loss(train_ids, eval_ids, seq_len, vocab, prior=20.0)
    loss = tr.model_loss(model, eval_ids, seq_len)
    print(f"held-out {loss:.3f} nats/token, unigram {unigram:.3f}, bigram {bigram:.3f}, {len(scored)} tokens")
    assert loss < unigram - 2.0
    # It uses context: better than a bigram model fit on the same training sample.
    assert loss < bigram


def test_tokenizer_round_trips_text(tokenizer):
    samples = [
        "import os\n\n\ndef main(argv: list[str]) -> int:\n\treturn 0  # tab\n",
        "naïve café – ünïcödé ✓ 日本語 🙂",
        "  leading and trailing spaces  ",
        "",
    ]
    for text in samples:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert all(0 <= i < len(tokenizer) for i in ids)
        assert tokenizer.decode(ids) == text
    assert len(tokenizer.encode("def " * 50, add_special_tokens=False)) < 60  # merges, not bytes


def _masked_text(tokenizer, conversation) -> tuple[list[int], list[int], str]:
    out = tokenizer.apply_chat_template(
        conversation, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    assert len(ids) == len(mask)
    return ids, mask, tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])


def test_chat_template_masks_assistant_tokens(tokenizer):
    conversation = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Add two numbers."},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
        {"role": "user", "content": "Now subtract."},
        {"role": "assistant", "content": "def sub(a, b):\n    return a - b"},
    ]
    ids, mask, masked = _masked_text(tokenizer, conversation)
    assert ids[0] == tokenizer.bos_token_id
    assert masked == "def add(a, b):\n    return a + b<|end|>def sub(a, b):\n    return a - b<|end|>"
    text = tokenizer.decode(ids)
    assert text.startswith(
        "<|bos|><|system|>You write Python.<|end|><|user|>Add two numbers.<|end|><|assistant|>"
    )
    # No role marker and no user text is ever in the mask.
    role_ids = set(tokenizer.convert_tokens_to_ids([tt.USER, tt.ASSISTANT, tt.SYSTEM]))
    assert not any(m and i in role_ids for i, m in zip(ids, mask, strict=True))

    prompt = tokenizer.apply_chat_template(conversation[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|end|><|assistant|>")


def test_chat_template_accepts_sharegpt_and_rejects_unknown_roles(tokenizer):
    sharegpt = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    openai = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert _masked_text(tokenizer, sharegpt)[0] == _masked_text(tokenizer, openai)[0]
    assert _masked_text(tokenizer, sharegpt)[2] == "hello<|end|>"
    with pytest.raises(Exception, match="unknown role: narrator"):
        tokenizer.apply_chat_template([{"role": "narrator", "content": "x"}], tokenize=False)


def test_chat_training_documents_follow_the_template(tokenizer):
    messages = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == tokenizer.bos_token + tt.render_chat(messages)

    train_files, _ = tt.corpus_files()
    docs = tt.conversation_texts(tt.spread_order(train_files, 0)[:40], max_chars=20_000)
    assert docs, "no documented functions found in 40 stdlib files"
    for doc in docs[:20]:
        assert doc.startswith(tt.USER + "Write a Python function `") and doc.endswith(tt.END)
        ids = tokenizer.encode(doc, add_special_tokens=False)
        assert ids.count(tokenizer.convert_tokens_to_ids(tt.ASSISTANT)) == 1
        assert tokenizer.decode(ids) == doc


def test_corpus_split_is_deterministic_and_disjoint():
    train_a, heldout_a = tt.corpus_files()
    train_b, heldout_b = tt.corpus_files()
    assert train_a == train_b and heldout_a == heldout_b
    assert not set(train_a) & set(heldout_a)
    assert 0.03 < len(heldout_a) / (len(train_a) + len(heldout_a)) < 0.2
    root = tt.stdlib_dir()
    assert all(tt.is_heldout(p.relative_to(root).as_posix()) for p in heldout_a)


def test_incomplete_directory_is_not_taken_for_a_target(tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(et.SHIPPED_DIR, partial)
    (partial / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n")
    assert not et.is_complete(partial)
    (partial / "model.safetensors").unlink()
    assert not et.is_complete(partial)


def test_cache_dir_is_used_when_not_preferring_shipped(tmp_path, monkeypatch):
    cached = tmp_path / et.CACHE_SUBDIR
    shutil.copytree(et.SHIPPED_DIR, cached)
    assert et.ensure_embedded_target(tmp_path, prefer_shipped=False) == cached
    monkeypatch.setenv("HSMON_CACHE", str(tmp_path))
    assert et.default_cache_dir() == tmp_path
    assert et.ensure_embedded_target(prefer_shipped=False) == cached


@pytest.mark.slow
def test_make_target_builds_a_loadable_directory(tmp_path):
    out = tmp_path / "target"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "hsmon", "make-target", "--out", str(out), "--seconds", "6", "--seed", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out loss: model" in proc.stdout and "unigram" in proc.stdout
    assert et.is_complete(out)
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == tt.CHAT_TEMPLATE
    info = json.loads((out / et.BUILD_INFO).read_text())
    assert info["steps"] >= 1 and info["seed"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging dir left behind"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert loaded.config.num_hidden_layers >= 8
    ids = torch.tensor([tok.encode("print('hi')")])
    assert loaded(input_ids=ids).logits.shape == (1, ids.shape[1], loaded.config.vocab_size)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False).startswith("<|bos|>")


def test_make_target_rejects_bad_seconds(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "hsmon", "make-target", "--out", str(tmp_path / "t"), "--seconds", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--seconds must be positive" in proc.stderr
    assert not (tmp_path / "t").exists()


def test_auto_threads_stays_within_one_and_two():
    assert 1 <= tr.auto_threads() <= 2
    assert tr.auto_threads(limit=1) == 1

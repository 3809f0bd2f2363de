"""A mistyped option, choice or command gets one line with the nearest one ("did you mean
--chunk-size?"), not a screen of usage: the real `hsmon` dispatcher and each command's parser."""

from __future__ import annotations

import pytest

from hsmon import cli


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        code = cli.main(list(argv))
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_a_mistyped_option_names_the_nearest_one(capsys) -> None:
    assert refusal(capsys, "extract", "d.jsonl", "--out", "x", "--chunksize", "64") == (
        "hsmon extract: unrecognized argument --chunksize: did you mean --chunk-size? "
        "(`hsmon extract --help` lists the options)")
    assert "--urll: did you mean --url?" in refusal(capsys, "status", "--urll", "http://x")
    assert "--frobnicate: no such option" in refusal(capsys, "daemon", "--frobnicate=3")


def test_a_mistyped_choice_and_command_name_the_nearest_one(capsys) -> None:
    assert refusal(capsys, "extract", "d.jsonl", "--out", "x", "--backend", "sglng") == (
        "hsmon extract: --backend sglng: not a choice; did you mean sglang? (choose from hf, sglang, vllm)")
    assert refusal(capsys, "extarct") == (
        "hsmon: unknown command 'extarct'; did you mean 'extract'? run 'hsmon --help' for the list")

"""benchmarks/step_pieces.py: the engine over the arena runner in one process, each piece of a decode step
timed by kind of request; the pieces' originals back afterwards."""

from __future__ import annotations

import json

import pytest

from attnserve.engine import burst, whole_draw
from attnserve.runtime import arena_runner
from benchmarks import step_pieces


def test_each_kinds_step_is_timed_by_its_pieces_and_the_originals_are_back(tiny_model_dir, tmp_path):
    out = tmp_path / "pieces.json"
    kinds = "greedy,top_p,logprobs"
    argv = ["--model", str(tiny_model_dir), "--streams", "2", "--kinds", kinds, "--rounds", "1"]
    assert step_pieces.main([*argv, "--new-tokens", "8", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["stamp"]["tree"] and [row["streams"] for row in result["rows"]] == [2]
    got = result["rows"][0]["kinds"]
    assert list(got) == kinds.split(",")
    for kind, pieces in got.items():
        runs, step = pieces[step_pieces.MODEL_RUNS], pieces["step"]
        assert 0 < runs < step, kind
        assert abs(pieces[step_pieces.OUTSIDE] - (step - runs)) < 1e-6 * step, kind
    assert got["greedy"]["x greedy (step time)"] == 1.0
    assert got["greedy"]["greedy step (runner)"] > 0 and "drawn step (runner)" not in got["greedy"]
    assert got["top_p"]["drawn step (runner)"] > 0 and got["top_p"]["step's PassRows"] > 0
    for owner, name in (
        (arena_runner.ArenaRunner, "_greedy"),
        (burst.BurstDraws, "rows"),
        (whole_draw, "draws_logits"),
    ):
        assert getattr(owner, name).__name__ == name  # unwrapped


def test_an_unknown_kind_is_refused_naming_it(capsys):
    with pytest.raises(SystemExit) as exit:
        step_pieces.main(["--model", "x", "--kinds", "greedy,beam"])
    assert exit.value.code == 2
    assert "--kinds: beam not of" in capsys.readouterr().err

"""The pipeline trainer's pure pieces: schedule orders, their replay, stage splitting, layout
checks, and the model chunks (CPU, no process group)."""

from __future__ import annotations

import pytest
import torch

from diag.contract import ledger
from diag.contract.schedules import (
    Action,
    check_layout,
    peak_in_flight,
    replay,
    schedule_order,
    simulate,
    split_layers,
    warmup_forwards,
)
from reference_runs.model import GPT, GPTConfig
from reference_runs.pp import build_chunks, main

LAYOUTS = [  # schedule, stages, microbatches, chunks
    ("gpipe", 4, 8, 1),
    ("1f1b", 4, 8, 1),
    ("1f1b", 4, 2, 1),
    ("1f1b", 4, 1, 1),
    ("1f1b", 1, 3, 1),
    ("interleaved", 4, 8, 2),
    ("interleaved", 2, 4, 2),
    ("interleaved", 4, 4, 3),
]


def test_1f1b_warmup_steady_cooldown() -> None:
    f, b = (lambda mb: Action("fwd", mb, 0)), (lambda mb: Action("bwd", mb, 0))
    # stage 1 of 4, 6 micro-batches: 2 warm-up forwards, 4 pairs, 2 drained backwards
    assert schedule_order("1f1b", 1, 4, 6) == [
        f(0), f(1),
        f(2), b(0), f(3), b(1), f(4), b(2), f(5), b(3),
        b(4), b(5),
    ]  # fmt: skip
    # the last stage has no warm-up: forward, backward, forward, ...
    assert schedule_order("1f1b", 3, 4, 2) == [f(0), b(0), f(1), b(1)]
    assert schedule_order("gpipe", 0, 4, 3) == [f(0), f(1), f(2), b(0), b(1), b(2)]


@pytest.mark.parametrize("stage", range(4))
def test_warmup_counts(stage: int) -> None:
    p, m = 4, 8
    assert warmup_forwards("1f1b", stage, p, m) == p - stage - 1
    assert warmup_forwards("gpipe", stage, p, m) == m
    assert warmup_forwards("interleaved", stage, p, m, 2) == 2 * (p - stage - 1) + p
    assert warmup_forwards("1f1b", stage, p, 1) == min(p - stage - 1, 1)  # m < p
    order = schedule_order("1f1b", stage, p, m)
    assert [a.kind for a in order[: p - stage - 1]] == ["fwd"] * (p - stage - 1)
    assert order[p - stage - 1 : p - stage + 1] == [Action("fwd", p - stage - 1, 0),
                                                    Action("bwd", 0, 0)]  # fmt: skip


@pytest.mark.parametrize("schedule, p, m, v", LAYOUTS)
def test_every_action_once_and_backward_after_forward(schedule: str, p: int, m: int, v: int):
    for stage in range(p):
        order = schedule_order(schedule, stage, p, m, v)
        expected = {(k, mb, c) for k in ("fwd", "bwd") for mb in range(m) for c in range(v)}
        assert len(order) == len(expected) and set(order) == expected
        for action in order:
            if action.kind == "bwd":
                assert order.index(Action("fwd", action.mb, action.chunk)) < order.index(action)


def test_interleaved_walks_groups_of_p_micro_batches_per_chunk() -> None:
    fwds = [(a.mb, a.chunk) for a in schedule_order("interleaved", 0, 2, 4, 2) if a.kind == "fwd"]
    assert fwds == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    bwds = [(a.mb, a.chunk) for a in schedule_order("interleaved", 0, 2, 4, 2) if a.kind == "bwd"]
    assert bwds == [(0, 1), (1, 1), (0, 0), (1, 0), (2, 1), (3, 1), (2, 0), (3, 0)]


@pytest.mark.parametrize("schedule, p, m, v", LAYOUTS)
def test_replay_has_the_ledger_bubble_on_every_stage(schedule: str, p: int, m: int, v: int):
    sim = simulate(schedule, p, m, v, fwd_time=1.0, bwd_time=2.0)
    for stage in range(p):
        assert sim.bubble(stage) == pytest.approx(ledger.bubble_fraction(p, m, v))


def test_in_flight_micro_batches_gpipe_grows_with_m_1f1b_stays_below_p() -> None:
    p = 4
    for m in (4, 8, 16):
        for stage in range(p):
            assert peak_in_flight(schedule_order("gpipe", stage, p, m)) == m
            assert peak_in_flight(schedule_order("1f1b", stage, p, m)) == p - stage
    assert simulate("1f1b", p, 8).peak_in_flight == [4, 3, 2, 1]


def test_replay_detects_a_deadlock() -> None:
    # The last stage runs a backward before the forward it needs.
    bad = [schedule_order("1f1b", 0, 2, 2), [Action("bwd", 0, 0), Action("fwd", 0, 0),
                                             Action("fwd", 1, 0), Action("bwd", 1, 0)]]  # fmt: skip
    with pytest.raises(RuntimeError, match="deadlock"):
        replay(bad)


def test_split_layers_and_layout_errors_name_the_numbers() -> None:
    assert split_layers(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert split_layers(8, 2, 2) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    with pytest.raises(ValueError, match=r"--layers \(6\) must be divisible by --pp \(4\)"):
        split_layers(6, 4)
    with pytest.raises(ValueError, match=r"--layers \(4\).*--pp \(2\) x --virtual-stages \(4\)"):
        check_layout("interleaved", 4, 2, 4, 4)
    with pytest.raises(ValueError, match=r"--microbatches \(6\) divisible by --pp \(4\)"):
        check_layout("interleaved", 8, 4, 6, 2)
    with pytest.raises(ValueError, match="needs --schedule interleaved"):
        check_layout("1f1b", 8, 4, 8, 2)
    check_layout("1f1b", 4, 4, 2)


def test_trainer_exits_2_on_indivisible_layers(monkeypatch, capsys) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(SystemExit) as exit_info:
        main(["--layers", "6", "--steps", "1"])
    assert exit_info.value.code == 2
    assert "--layers (6) must be divisible by --pp (4)" in capsys.readouterr().err


@pytest.mark.parametrize("stages, chunks", [(2, 1), (4, 1), (2, 2)])
def test_chunks_chained_equal_the_whole_model(stages: int, chunks: int) -> None:
    torch.manual_seed(0)
    config = GPTConfig(layers=4, hidden=32, heads=4, seq_len=16, vocab=64)
    idx = torch.randint(64, (2, 16))
    torch.manual_seed(0)
    reference, _ = GPT(config)(idx)
    torch.manual_seed(0)
    gpt = GPT(config)
    ranks = [build_chunks(gpt, s, stages, chunks) for s in range(stages)]
    x = idx
    for k in range(stages * chunks):  # model stage k = chunk * stages + stage
        x = ranks[k % stages][k // stages](x)
    # the untied LM head starts as a copy of the embedding: same logits as the tied model
    assert torch.allclose(x, reference, atol=1e-6)
    head = ranks[(stages * chunks - 1) % stages][chunks - 1].lm_head.weight
    assert head.data_ptr() != gpt.tok_emb.weight.data_ptr()

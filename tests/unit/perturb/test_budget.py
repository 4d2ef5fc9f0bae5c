"""Memory is estimated before the first forward; a run beyond the budget is one InputError that
says which option to lower, and to what."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.models import build_reference
from attnprobe.perturb import budget, run
from attnprobe.perturb.budget import Footprint, available_bytes, check_budget, forward_bytes
from tests.conftest import track

TEXT = "the cat sat on the red mat"


@pytest.fixture(scope="module")
def classifier():
    model, tok = build_reference("transformer-classifier")
    return track(model), tok


def _named(option: str) -> str:
    return f"{option} (--{option})"


def test_the_forward_estimate_covers_the_weights_a_capture_holds(classifier):
    """Lower bound, independently: the scoped weights one forward computes (read off the maps
    a capture keeps), for every layer, are part of what the estimate counts."""
    model, tok = classifier
    batch = tok([TEXT] * 3)
    with torch.no_grad(), ap.capture(model) as cap:
        model(**batch)
    weights = sum(m.pattern.numel() * m.pattern.element_size() for m in cap.maps)  # 1 text
    seq = len(batch["input_ids"][0])
    for rows in (1, 3, 50):
        assert forward_bytes(model, rows, seq) >= rows * weights / len(cap.maps[0].layers)
        assert forward_bytes(model, rows, seq, grad=True) >= rows * weights
    # linear in the rows, and more than quadratic growth would need: seq² for the weights
    one = forward_bytes(model, 1, seq)
    assert forward_bytes(model, 7, seq) == 7 * one
    assert forward_bytes(model, 1, 2 * seq) < 4 * one + 1  # at most 4x for twice the tokens


def test_available_memory_is_read_from_the_system():
    found = available_bytes("cpu")
    assert found is not None and found > 0
    assert available_bytes("meta") is None


def test_budget_messages_name_the_option_and_a_value_that_fits(classifier, monkeypatch):
    model, _ = classifier
    room = 2**20
    monkeypatch.setattr(budget, "available_bytes", lambda device="cpu": room)
    one = forward_bytes(model, 1, 8)
    fits = int(0.8 * room // one)
    check_budget(model, "permute", Footprint(fits), 8, _named)  # fits: nothing raised
    with pytest.raises(InputError, match=rf"^perturb permute: a forward of {fits + 1} rows x 8 "
                                         rf"tokens .* set batch_size \(--batch_size\) to "
                                         rf"{fits} or less$"):
        check_budget(model, "permute", Footprint(fits + 1), 8, _named)
    held = Footprint(1, held_count=10**6, held_each=24, held_by="n_permutations")
    with pytest.raises(InputError, match=r"n_permutations \(--n_permutations\) = 1000000 holds "
                                         r"about 0.0224 GiB .* lower n_permutations "
                                         r"\(--n_permutations\) to \d+ or less"):
        check_budget(model, "permute", held, 8, _named)
    monkeypatch.setattr(budget, "available_bytes", lambda device="cpu": one // 2)
    with pytest.raises(InputError, match="even one row of 8 tokens needs about"):
        check_budget(model, "adversarial", Footprint(1, rows_by="n_adversaries"), 8, _named)
    monkeypatch.setattr(budget, "available_bytes", lambda device="cpu": None)
    check_budget(model, "permute", Footprint(10**9), 10**4, _named)  # unknown: not refused


def test_run_refuses_before_any_forward(classifier, monkeypatch):
    model, tok = classifier
    monkeypatch.setattr(budget, "available_bytes", lambda device="cpu": 2**20)
    calls = []
    handle = model.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(InputError, match=r"lower n_draws \(--draws\) to \d+ or less"):
            run(model, tok, [TEXT], "dirichlet", n_draws=10**6)
        with pytest.raises(InputError, match=r"set n_adversaries \(--adversaries\) to"):
            run(model, tok, [TEXT], "adversarial", n_adversaries=10**5)
        with pytest.raises(InputError, match=r"a forward of 200 rows .* set batch_size "
                                             r"\(--batch-size\) to"):
            run(model, tok, [TEXT] * 200, "importance", batch_size=10**5)
    finally:
        handle.remove()
    assert calls == []


def test_the_budget_counts_the_rows_the_run_will_have(classifier, monkeypatch):
    # `perturb --text "The cat sat." --batch-size 200000` was refused as "a forward of 200000
    # rows": one text is one row, and a text of n tokens has at most n - 1 erasure steps
    model, tok = classifier
    seq = len(tok([TEXT])["input_ids"][0])
    room = int(forward_bytes(model, 3, seq, grad=True) / budget.BUDGET_SHARE) + 1
    monkeypatch.setattr(budget, "available_bytes", lambda device="cpu": room)  # 3 rows fit
    assert forward_bytes(model, seq - 1, seq) < forward_bytes(model, 3, seq, grad=True)
    for experiment, options in (("uniform", {}), ("ablate", {}), ("importance", {}),
                                ("erase", {"rankings": ["attention"]})):
        table = run(model, tok, [TEXT] * 3, experiment, batch_size=10**8, **options)
        assert len(table) > 0, experiment
    with pytest.raises(InputError, match=rf"^perturb importance: a forward of 4 rows x {seq} "
                                         r"tokens .* set batch_size \(--batch-size\) to 3 "
                                         r"or less$"):
        run(model, tok, [TEXT] * 4, "importance", batch_size=10**8)


@pytest.mark.parametrize(("experiment", "options", "rows"), [
    ("uniform", {}, 3), ("mean", {}, 3), ("importance", {}, 3),  # the texts, not batch_size
    ("permute", {"n_permutations": 5}, 5), ("dirichlet", {"n_draws": 7}, 7),  # the draws
    ("erase", {}, 5),  # the steps of a 6-token text: every key but one
    ("adversarial", {"n_adversaries": 2}, 2),
])
def test_footprints_count_rows_from_the_work_itself(experiment, options, rows):
    params = ap.perturb.params_of(experiment)(**options)
    assert params.footprint(10**8, 3, 6).rows == rows
    assert params.footprint(2, 3, 6).rows == min(2, rows)

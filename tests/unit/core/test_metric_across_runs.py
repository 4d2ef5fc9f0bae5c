"""Issue 24 item 20: patching compares one answer across runs, so a metric of the input's
next token (``logit:next``, ``loss``) reads the clean input's next token in every run, and the
table says so (``logit:next(clean)``). The expected numbers are read off plain forwards of the
clean and corrupted ids, at the clean answer."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap

# the pair: at position 6 the clean next token is 54, the corrupted one 55
CLEAN = [2, 19, 25, 54, 17, 19, 25, 54]
CORRUPT = [2, 19, 26, 54, 17, 19, 25, 55]
POSITION, ANSWER = 6, 54
TOLERANCE = dict(rel=1e-5, abs=1e-5)  # float32: batched forwards differ in the ~6th digit


@pytest.fixture(scope="module")
def induction():
    return ap.load_model("ref:induction")


def logits_of(model, ids: list[int]) -> torch.Tensor:
    """``[seq, vocab]`` of one plain forward."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]),
                     attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0]


@pytest.mark.parametrize(("experiment", "direction"), [
    ("heads", "denoising"), ("heads", "noising"), ("attribution", "noising"),
    ("attribution", "denoising")])
def test_logit_next_reads_the_clean_answer_in_both_runs(induction, experiment, direction):
    model, tok = induction
    clean = float(logits_of(model, CLEAN)[POSITION, ANSWER])
    corrupt = float(logits_of(model, CORRUPT)[POSITION, ANSWER])
    assert CORRUPT[POSITION + 1] != ANSWER  # the corrupted run's own next token differs
    table = ap.patch.run(model, tok, [CLEAN], [CORRUPT], "logit:next", experiment,
                         metric_positions=[POSITION], direction=direction)
    assert set(table["metric"]) == {"logit:next(clean)"}
    assert table["clean"].iloc[0] == pytest.approx(clean, **TOLERANCE)
    assert table["corrupt"].iloc[0] == pytest.approx(corrupt, **TOLERANCE)


def test_loss_reads_the_clean_answer_in_both_runs(induction):
    model, tok = induction
    want = [-float(logits_of(model, ids)[POSITION].log_softmax(-1)[ANSWER])
            for ids in (CLEAN, CORRUPT)]
    table = ap.patch.heads(model, tok, [CLEAN], [CORRUPT], "loss", metric_positions=[POSITION])
    assert set(table["metric"]) == {"loss(clean)"}
    assert table["clean"].iloc[0] == pytest.approx(want[0], **TOLERANCE)
    assert table["corrupt"].iloc[0] == pytest.approx(want[1], **TOLERANCE)


def test_a_single_run_still_reads_its_own_next_token(induction):
    """Perturbation and direct logit attribution read one input: its own next token."""
    model, tok = induction
    own = float(logits_of(model, CORRUPT)[POSITION, CORRUPT[POSITION + 1]])
    table = ap.perturb.run(model, tok, [CORRUPT], "uniform", metric="logit:next",
                           positions=[POSITION])
    assert set(table["metric"]) == {"logit:next"}
    assert table["baseline"].iloc[0] == pytest.approx(own, **TOLERANCE)
    dla = ap.heads.logit_attribution(model, tok, [CORRUPT], "logit:next",
                                     metric_positions=[POSITION])
    assert set(dla.totals["metric"]) == {"logit:next"}
    assert dla.totals["value"].iloc[0] == pytest.approx(own, **TOLERANCE)

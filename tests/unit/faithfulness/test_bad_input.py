"""Adversarial input to ``faithfulness.evaluate`` and ``attnprobe faithfulness``: each case is
a one-line error or a number equal to an independent computation — never a traceback, a
silently duplicated row or a number read from the wrong position.

Hand computations run one forward per perturbed input, unpadded, so they share nothing with
the pooled, padded batches under test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch
import transformers

from attnprobe.attribution.method_base import Explanation, Problem
from attnprobe.errors import InputError
from attnprobe.faithfulness import evaluate
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert_classifier
from tests.helpers import run_cli as run
from tests.unit.faithfulness.bag_of_words import VOCAB, BagOfWords, weights
from tests.unit.faithfulness.test_evaluate import WORDS, Planted

EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def tok():
    return bert_tokenizer(bert_vocab(WORDS))


@pytest.fixture(scope="module")
def bow():
    return BagOfWords(weights(0)).eval()


@pytest.fixture(scope="module")
def gpt(tok):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2,
                                     n_positions=32)
    return track(transformers.GPT2LMHeadModel(config).eval())


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _last_logits(lm, ids: list[int]) -> torch.Tensor:
    """``[vocab]`` logits at the last position of one unpadded forward."""
    with torch.no_grad():
        return lm(input_ids=torch.tensor([ids])).logits[0, -1]


def _comprehensiveness(result, source: str, example: str = "0") -> np.ndarray:
    t = result.table
    rows = t[(t["source"] == source) & (t["metric"] == "comprehensiveness")
             & (t["example_id"] == example)]
    return rows["value"].to_numpy()


@dataclass(frozen=True)
class Recording:
    """Scores each token by its id and records the target every call explains."""

    seen: list
    name: ClassVar[str] = "recording"
    summary: ClassVar[str] = "token id as score; records the target"
    knob: ClassVar[str | None] = None

    def cost(self, n_tokens: int) -> int:
        return 0

    def explain(self, problem: Problem) -> Explanation:
        self.seen.append(problem.target.spec)
        return Explanation(problem.ids[0].double())


# ----------------------------------------------------------------------------- sources
def test_views_alone_are_scored_against_the_fixed_next_token(gpt, tok):
    """``methods=[]`` with a view: the target is fixed on the unperturbed text (the model's own
    top next token, found by hand) and the view's comprehensiveness is that token's logit
    drop with the view's top token deleted (raw attention of the last layer, heads averaged,
    read at the last query row, taken from the model's own attention output)."""
    ids = _ids(tok, "the cat sat on a mat dog")
    result = evaluate(gpt, tok, [ids], "next-token", methods=[], views=["raw"],
                      levels=(0.2,), curve_steps=2)
    logits = _last_logits(gpt, ids)
    token = int(logits.argmax())
    assert set(result.table["target"]) == {f"next-token:{token}"}
    # the attention weights of an eager copy (the SDPA kernel returns none)
    eager = transformers.GPT2LMHeadModel._from_config(gpt.config, attn_implementation="eager")
    eager.load_state_dict(gpt.state_dict())
    with torch.no_grad():
        attn = eager.eval()(input_ids=torch.tensor([ids]), output_attentions=True).attentions[-1]
    row = attn[0].mean(0)[-1, :-1]  # the last position is the explained one: never removed
    top = int(row.argmax())
    want = float(logits[token] - _last_logits(gpt, ids[:top] + ids[top + 1:])[token])
    got = _comprehensiveness(result, "raw@L1")[0]
    assert got == pytest.approx(want, abs=64 * EPS32 * float(logits.abs().max()))


def test_duplicate_method_names_are_refused(bow, tok):
    with pytest.raises(InputError, match=r"'saliency' is given twice"):
        evaluate(bow, tok, ["the cat sat on"], "class:1", methods=["saliency", "saliency"],
                 views=[])
    with pytest.raises(InputError, match="planted"):
        evaluate(bow, tok, ["the cat sat on"], "class:1", views=[],
                 methods=[Planted(bow.w.detach()), Planted(-bow.w.detach())])


def test_methods_none_is_one_line(bow, tok):
    with pytest.raises(InputError, match="methods"):
        evaluate(bow, tok, ["the cat sat on"], "class:1", methods=None, views=["raw"])


# ----------------------------------------------------------------------------- levels
@pytest.mark.parametrize(("levels", "message"), [
    (0.2, "levels must be a sequence"),
    ((0.2, 0.2), "repeated"),
])
def test_bad_levels_are_one_line(bow, tok, levels, message):
    with pytest.raises(InputError, match=message):
        evaluate(bow, tok, ["the cat sat on"], "class:1", methods=[Planted(bow.w.detach())],
                 views=[], levels=levels)


def test_unsorted_levels_give_the_sorted_values_per_level(bow, tok):
    planted = [Planted(bow.w.detach())]
    text = ["the cat sat on a mat dog ran"]
    ahead = evaluate(bow, tok, text, "class:1", methods=planted, views=[], levels=(0.5, 0.25))
    sorted_ = evaluate(bow, tok, text, "class:1", methods=planted, views=[],
                       levels=(0.25, 0.5))

    def by_level(result):
        t = result.table
        rows = t[(t["source"] == "planted") & (t["metric"] == "comprehensiveness")]
        return dict(zip(rows["level"], rows["value"], strict=True))

    assert by_level(ahead) == by_level(sorted_)


# ----------------------------------------------------------------------------- budget
def test_the_budget_counts_every_curve(bow, tok):
    """The estimate is rows × tokens with rows = the full text + one leave-one-out input per
    real token + per source (and the random baseline) 2 inputs per level and one per point of
    each of the 4 curves (deletion and insertion, MoRF and LeRF)."""
    text = "the cat sat on a mat"
    n_real, seq = 6, 8
    levels, steps, sources = (0.2, 0.5), 3, 1
    rows = 1 + n_real + (sources + 1) * (2 * len(levels) + 4 * (steps + 1))
    method = [Planted(bow.w.detach())]
    with pytest.raises(InputError, match=f"{rows} inputs"):
        evaluate(bow, tok, [text], "class:1", methods=method, views=[], levels=levels,
                 curve_steps=steps, budget=rows * seq - 1)
    evaluate(bow, tok, [text], "class:1", methods=method, views=[], levels=levels,
             curve_steps=steps, budget=rows * seq)


# ----------------------------------------------------------------------------- targets
def test_a_target_that_raises_is_one_line(bow, tok):
    def broken(output, inputs):
        raise ValueError("no such logit")

    with pytest.raises(InputError, match="ValueError: no such logit") as caught:
        evaluate(bow, tok, ["the cat sat on"], broken,
                 methods=[Planted(bow.w.detach())], views=[])
    assert "\n" not in str(caught.value)


def test_a_callable_target_reads_each_input_unpadded(gpt, tok):
    """A callable that reads the last position (``logits[:, -1]``, as one writes for a decoder)
    sees each perturbed input at its own length: deleting tokens shortens the inputs, and a
    right-padded batch would put padding where it reads."""
    token = 7

    def last_logit(output, inputs):
        return output.logits[:, -1, token]

    ids = _ids(tok, "the cat sat on a mat dog ran")
    scores = torch.zeros(VOCAB, dtype=torch.float64)
    scores[ids[0]] = 1.0  # rank the first token first, the rest by position (ties: earlier)
    result = evaluate(gpt, tok, [ids], last_logit, methods=[Planted(scores)], views=[],
                      levels=(0.2, 0.5), curve_steps=2)
    n = len(ids) - 1  # the last position is the explained one: never removed
    full = float(_last_logits(gpt, ids)[token])
    counts = [min(n - 1, max(1, math.floor(level * n + 0.5))) for level in (0.2, 0.5)]
    order = list(range(n))  # the first token, then the others by position (all tied at 0)
    want = [full - float(_last_logits(gpt, [ids[p] for p in range(len(ids))
                                            if p not in order[:k]])[token]) for k in counts]
    got = _comprehensiveness(result, "planted")
    np.testing.assert_allclose(got, want, atol=64 * EPS32 * (1 + abs(full)))


# ----------------------------------------------------------------------------- sanity
def test_randomize_without_sanity_is_refused(bow, tok):
    with pytest.raises(InputError, match="sanity"):
        evaluate(bow, tok, ["the cat sat on"], "class:1", methods=[Planted(bow.w.detach())],
                 views=[], randomize=1)


def test_the_randomised_copy_explains_the_same_next_token():
    """Model randomisation compares explanations of one output: on the copy the method is
    asked about the token the original model predicted, not the copy's own top token (on
    the trained induction model the two differ)."""
    import attnprobe as ap
    from attnprobe.faithfulness.sanity import randomized_copy

    lm, tok = ap.load_model("ref:induction")
    text = "t03 t07 t01 t05 t03 t07"
    seen: list[str] = []
    evaluate(lm, tok, [text], "next-token", methods=[Recording(seen)], views=[],
             levels=(0.5,), curve_steps=2, sanity=True, randomize=1)
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        token = int(lm(input_ids=ids)[0, -1].argmax())  # [batch, seq, vocab] logits
        other = int(randomized_copy(lm, 1, seed=0)(input_ids=ids)[0, -1].argmax())
    assert other != token  # otherwise the test could not tell the two apart
    assert seen == [f"next-token:{token}"] * 2


# ----------------------------------------------------------------------------- CLI
def test_cli_refuses_duplicate_methods(tmp_path, capsys):
    out = tmp_path / "rows.csv"
    code, printed, err = run(["faithfulness", "--model", "ref:transformer-classifier",
                              "--text", "key cat the dog", "--target", "class:1",
                              "--methods", "saliency,saliency", "--views", "raw",
                              "--out", str(out), "--quiet"], capsys)
    assert code == 2 and printed == ""
    assert err.startswith("attnprobe: error:") and err.count("\n") == 1 and "saliency" in err
    assert not out.exists()


def test_a_tiny_classifier_accepts_views_alone():
    model, tok = tiny_bert_classifier(WORDS)
    result = evaluate(model, tok, ["the cat sat on a mat"], "class:1", methods=[],
                      views=["raw"], levels=(0.5,), curve_steps=2)
    assert set(result.table["source"]) == {"raw@L1", "random"}
    assert result.table.loc[result.table["source"] == "raw@L1", "value"].notna().all()


@pytest.mark.parametrize(("levels", "message"), [
    ("", "expected comma-separated shares"),
    ("0.2,0.2", "repeated"),
])
def test_cli_refuses_bad_levels(tmp_path, capsys, levels, message):
    out = tmp_path / "rows.csv"
    code, printed, err = run(["faithfulness", "--model", "ref:transformer-classifier",
                              "--text", "key cat the dog", "--target", "class:1",
                              "--methods", "saliency", "--views", "raw", "--levels", levels,
                              "--out", str(out), "--quiet"], capsys)
    assert code == 2 and printed == ""
    assert err.startswith("attnprobe: error:") and err.count("\n") == 1 and message in err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["magnitude", "sanity"])
def test_a_switch_that_is_not_a_bool_is_refused(bow, tok, flag):
    """``sanity="no"`` is truthy: taken as given it would run the check the caller declined."""
    with pytest.raises(InputError, match=f"{flag} must be True or False"):
        evaluate(bow, tok, ["the cat sat on"], "class:1", methods=[Planted(bow.w.detach())],
                 views=[], **{flag: "no"})

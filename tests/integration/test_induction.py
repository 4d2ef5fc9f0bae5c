"""``ref:induction`` (issue 12 §1): every analysis recovers the trained copy circuit.

The model is loaded from the weight cache (trained once, about a minute, when missing). Ground
truth comes from the data, not from the code under test: :func:`repeated_segments` records for
every second-copy position ``i`` the position ``source`` of the same token in the first copy,
so the token to predict is the one at ``source + 1`` (Olsson et al. 2022). Expected values are
either built by construction (oracle and uniform models for the scores), computed independently
here (prefix forwards through the tokenizer, attention read off extracted maps at the known
positions), or the claims of the circuit (copying above 90 % and at chance without the
circuit heads); no expected number is copied from a run.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.heads.probe import repeated_token_scores
from attnprobe.heads.scores import wide_scores
from attnprobe.models.induction import Recipe, Segments
from attnprobe.tasks.induction import (
    CopyStep,
    copy_scores,
    copy_steps,
    copy_task,
    held_out,
    prefix_text,
    segment_texts,
)
from tests.conftest import track

N_SEQUENCES = 48  # about 640 second-copy positions
N_EXPLAINED = 24  # copy steps explained by attribution
N_STORED = 16  # sequences for the stored-maps labels and the copy-accuracy check


@pytest.fixture(scope="module")
def trained():
    model, tok = ap.load_model("ref:induction")
    return track(model), tok


@pytest.fixture(scope="module")
def segments(trained):
    return held_out(N_SEQUENCES, tokenizer=trained[1])


@pytest.fixture(scope="module")
def census(trained, segments):
    model, tok = trained
    return ap.heads.census(model, tok, segment_texts(segments, tok), similarity=False)


@pytest.fixture(scope="module")
def labels(census):
    return census.classify()


def _scores(model, segments) -> dict[str, tuple[float, float]]:
    table = copy_scores(model, segments).set_index("half")
    return {half: (float(table.at[half, "accuracy"]), float(table.at[half, "loss"]))
            for half in ("first", "second")}


def _heads(labels, label: str) -> list[tuple[int, int]]:
    rows = labels[labels["label"] == label]
    return [(int(r.layer), int(r.head)) for r in rows.itertuples()]


def _scope(heads) -> str:
    return "heads:" + ",".join(f"{layer}.{head}" for layer, head in heads)


# ------------------------------------------------------------------------- the task helpers
class _Oracle(nn.Module):
    """Logits ``margin`` on the true next token at every position (read off the input's own
    shift), 0 elsewhere; ``margin=0`` is the uniform model."""

    def __init__(self, vocab: int, margin: float) -> None:
        super().__init__()
        self.vocab, self.margin = vocab, margin
        self.anchor = nn.Parameter(torch.zeros(()))  # a device for copy_scores to read

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*ids.shape, self.vocab)
        logits[:, :-1] = self.margin * nn.functional.one_hot(ids[:, 1:], self.vocab)
        return logits


def test_copy_scores_by_construction(trained, segments):
    vocab = len(trained[1])
    margin = 5.0
    oracle = _scores(_Oracle(vocab, margin), segments)
    expected_loss = math.log1p((vocab - 1) * math.exp(-margin))  # -log softmax of the margin
    for half in ("first", "second"):
        assert oracle[half][0] == 1.0
        assert oracle[half][1] == pytest.approx(expected_loss, rel=1e-5)
    uniform = copy_scores(_Oracle(vocab, 0.0), segments)
    assert uniform["loss"].tolist() == pytest.approx([math.log(vocab)] * 2, rel=1e-6)
    # every position of a copy is scored once: m - 1 per sequence and half
    second = int((segments.source >= 0).sum())
    assert uniform["positions"].tolist() == [second, second]


def test_copy_scores_equal_prefix_forwards(trained, segments):
    """Accuracy and loss from one batched forward = from one prefix per position, encoded
    through the tokenizer (the path every text-based analysis takes)."""
    model, tok = trained
    few = Segments(segments.input_ids[:4], segments.source[:4])
    hits, losses = [], []
    for step in copy_steps(few, per_sequence=None):
        ids = tok([prefix_text(few, tok, step)], return_tensors="pt")["input_ids"]
        assert torch.equal(ids[0], few.input_ids[step.example, :step.position + 1])
        with torch.no_grad():
            log_probs = model(ids)[0, -1].double().log_softmax(-1)
        truth = int(few.input_ids[step.example, step.position + 1])
        assert truth == int(few.input_ids[step.example, step.target])  # the copy
        hits.append(int(log_probs.argmax()) == truth)
        losses.append(-float(log_probs[truth]))
    accuracy, loss = _scores(model, few)["second"]
    assert accuracy == sum(hits) / len(hits)
    assert loss == pytest.approx(sum(losses) / len(losses), abs=1e-5)
    assert copy_scores(model, segments, batch_size=7).equals(copy_scores(model, segments))


def test_texts_round_trip_and_held_out_seed(trained, segments):
    tok = trained[1]
    encoded = tok(segment_texts(segments, tok), return_tensors="pt")["input_ids"]
    assert torch.equal(encoded, segments.input_ids)
    with pytest.raises(InputError, match="training"):
        held_out(4, seed=1, tokenizer=tok)  # the training stream's seed (recipe.seed + 1)
    assert not torch.equal(held_out(4, seed=2, tokenizer=tok).input_ids,
                           held_out(4, seed=3, tokenizer=tok).input_ids)


def test_bad_input(trained, segments):
    model, tok = trained
    with pytest.raises(InputError, match="not a second-copy position"):
        prefix_text(segments, tok, CopyStep(0, 1, 0))
    no_copy = Segments(segments.input_ids[:2], torch.full_like(segments.source[:2], -1))
    with pytest.raises(InputError, match="no sequence has a second-copy"):
        copy_steps(no_copy)
    with pytest.raises(InputError, match="no second-copy position"):
        copy_scores(model, no_copy)
    with pytest.raises(InputError, match="positive integer"):
        held_out(0, tokenizer=tok)
    with pytest.raises(InputError, match="logits"):
        copy_scores(_Flat(), segments)


class _Flat(nn.Module):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return ids.float()  # [batch, seq]: no vocabulary axis


# -------------------------------------------------------------------------------- the model
def test_model_copies_the_second_half_only(trained, segments):
    model, _ = trained
    scores = _scores(model, segments)
    assert scores["second"][0] > 0.9  # copies in context
    assert scores["first"][0] < 0.1  # the first copy is unpredictable (chance 1/64)
    assert scores["first"][1] - scores["second"][1] > 2.0  # nats
    steps, losses = zip(*model.training_log["loss"], strict=True)  # (step, training loss)
    assert steps[-1] == model.training_log["steps"] - 1 and losses[-1] < losses[0] - 1.0


# ------------------------------------------------------------------------------- the census
def test_census_labels_previous_then_induction(trained, segments, labels):
    previous, induction = _heads(labels, "previous"), _heads(labels, "induction")
    assert any(layer == 0 for layer, _ in previous)
    assert any(layer == 1 for layer, _ in induction)
    assert all(layer == 1 for layer, _ in induction) and all(layer == 0 for layer, _ in previous)
    scores = labels.set_index(["layer", "head"])
    for head in induction:  # the evidence, on the corpus and on the repeated-token probe
        assert scores.at[head, "induction"] > 0.5 and scores.at[head, "rep_induction"] > 0.4
    for head in previous:
        assert scores.at[head, "prev"] > 0.5

    # independently: the labelled heads' attention at the known positions of extracted maps
    model, tok = trained
    maps = ap.extract(model, tok, segment_texts(segments, tok)[:8])
    for head in induction:
        on_target = [float(maps[s.example].pattern[head[0], head[1], s.position, s.target])
                     for s in copy_steps(Segments(segments.input_ids[:8], segments.source[:8]),
                                         per_sequence=None)]
        assert sum(on_target) / len(on_target) > 0.4  # chance: about 1/30 of the row
    for head in previous:
        prev = [float(amap.pattern[head[0], head[1]].diagonal(-1).mean()) for amap in maps]
        assert sum(prev) / len(prev) > 0.5


def _copy_rows(segments: Segments) -> int:
    """Query rows holding an earlier copy of their token whose successor is no previous
    token: ``ids[j] == ids[q]`` for some ``1 <= j <= q - 3`` (the induction target ``j + 1``
    at offset -2 or further; [BOS] is no copy)."""
    rows = 0
    for ids in segments.input_ids.tolist():
        rows += sum(any(ids[j] == ids[q] for j in range(1, q - 2)) for q in range(1, len(ids)))
    return rows


def test_stored_maps_label_the_induction_heads_from_their_own_copies(trained, segments,
                                                                       labels):
    """Issue 17 item 4: without the probe (stored maps, ``repeated=False``) the copying rules
    read the data's own induction mass over its rows that hold a copy; the four layer-1
    heads are ``induction`` and the evidence names the corpus."""
    model, tok = trained
    segments = Segments(segments.input_ids[:N_STORED], segments.source[:N_STORED])
    texts = segment_texts(segments, tok)
    stored = ap.heads.classify(ap.extract(model, tok, texts))
    streamed = ap.heads.census(model, tok, texts, repeated=False, similarity=False).classify()
    assert list(stored["label"]) == list(streamed["label"])
    assert list(stored["evidence"]) == list(streamed["evidence"])
    rows = _copy_rows(segments)
    layer_1 = stored[stored["layer"] == 1]
    assert len(layer_1) == 4 and (layer_1["label"] == "induction").all(), layer_1["evidence"]
    for _, row in layer_1.iterrows():
        assert row["induction_rows"] == rows
        assert row["evidence"] == (f"induction={row['induction']:.3g} > 0.4 over {rows} rows")
    # the same heads as the probe finds, and nothing else is copying
    probed = labels.set_index("head_id")["label"]
    assert set(stored.loc[stored["label"] == "induction", "head_id"]) == \
        set(probed[probed == "induction"].index)
    assert (stored.loc[stored["layer"] == 0, "family"] != "copying").all()


def test_the_default_probe_fits_the_trained_length(trained, census, labels):
    """ref:induction was trained on 48-token sequences: the default probe stays inside them
    (23 tokens per copy after [BOS]) and the induction heads score as trained; a longer
    explicit length warns, naming the limit."""
    model, tok = trained
    assert model.trained_length == Recipe().seq_len
    assert census.probe_length == (Recipe().seq_len - 1) // 2
    induction = labels[labels["label"] == "induction"]
    assert len(induction) == 4 and (induction["rep_induction"] >= 0.9).all(), induction
    with pytest.warns(UserWarning, match=f"more than the {Recipe().seq_len} the model was "
                                         "trained on") as caught:
        long = wide_scores(repeated_token_scores(model, tok, length=32))
    assert len(caught) == 1
    past = long.set_index("head_id").loc[induction["head_id"], "rep_induction"]
    assert (past < induction.set_index("head_id")["rep_induction"]).all()  # why it warns


def test_copy_accuracy_on_the_copy_task_is_copy_scores(trained, segments):
    """``copy_accuracy`` on :func:`copy_task` scores the positions ``copy_scores`` scores as
    ``second``, with the same argmax: pooled, the two are equal. On the texts, it finds copy
    steps by a 4-token match, so it leaves out the first three positions of each copy."""
    model, tok = trained
    segments = Segments(segments.input_ids[:N_STORED], segments.source[:N_STORED])
    second = copy_scores(model, segments).set_index("half").loc["second"]
    task = ap.heads.copy_accuracy(model, tok, copy_task(segments))
    assert int(task["copy_steps"].sum()) == int(second["positions"])
    assert int(task["correct"].sum()) / int(task["copy_steps"].sum()) == second["accuracy"]
    firsts = 0
    for ids, second_half in zip(segments.input_ids.tolist(), segments.second_half,
                                strict=True):
        scored = second_half.nonzero()[:, 0].tolist()  # the copy but its last token
        target, _ = ap.heads.find_copy_steps(ids, min_match=4)
        assert all(target[i] >= 0 for i in scored[3:])  # 4 tokens of the copy match
        firsts += target[scored[0]] >= 0  # only if 3 random tokens before it match too
    assert firsts == 0


# ----------------------------------------------------------------------------- the ablation
def test_ablation_gap(trained, segments, labels):
    model, _ = trained
    base = _scores(model, segments)["second"][0]
    induction, previous = _heads(labels, "induction"), _heads(labels, "previous")
    drops = {}
    for layer, head in [(int(r.layer), int(r.head)) for r in labels.itertuples()]:
        with ap.perturb.perturbed(model, "zero", f"head:{layer}.{head}"):
            scores = _scores(model, segments)
        drops[(layer, head)] = base - scores["second"][0]
        assert scores["first"][0] < 0.1  # nothing to break before a copy exists
    with ap.perturb.perturbed(model, "zero", _scope(induction)):
        without_induction = _scores(model, segments)
    with ap.perturb.perturbed(model, "zero", _scope(previous)):
        without_previous = _scores(model, segments)

    # the induction heads together carry the copy: second-copy accuracy falls to chance
    joint = base - without_induction["second"][0]
    assert without_induction["second"][0] < without_induction["first"][0] + 0.05
    assert joint > 0.8
    assert base - without_previous["second"][0] > 0.5  # so do the previous-token heads
    others = [h for h in drops if h not in induction and h not in previous]
    assert others, "the census labels every head as part of the circuit"
    assert all(drops[h] < 0.05 for h in others)  # any other single head costs little
    assert joint > 10 * max(max(drops[h] for h in others), 0.01)
    # four induction heads share the job: none carries it alone
    assert all(drops[h] < joint / 2 for h in induction)


# --------------------------------------------------------------------------- the attribution
def test_attribution_top1_is_the_token_after_the_earlier_copy(trained, segments):
    model, tok = trained
    steps = copy_steps(segments, per_sequence=1, seed=0)[:N_EXPLAINED]
    texts = [prefix_text(segments, tok, s) for s in steps]
    with torch.no_grad():
        predicted = model(segments.input_ids).argmax(-1)
    ig = ap.attribution.attribute(model, tok, texts, "next-token", ["integrated_gradients"])
    ig_hits = axg_hits = 0
    for step, text, result in zip(steps, texts, ig, strict=True):
        assert result.target == f"next-token:{int(predicted[step.example, step.position])}"
        symbols = result.scores[1:]  # [BOS] is no candidate (and IG keeps it at its baseline)
        ig_hits += 1 + int(symbols.argmax()) == step.target
        target = ap.attribution.parse_target("next-token", model, tok)
        relevance = ap.attribution.attention_x_gradient(model, tok, text, target, query="last")
        context = relevance[1:-1]  # the query's own 1 (rollout's identity) left out
        axg_hits += 1 + int(context.argmax()) == step.target
    chance = sum(1 / s.position for s in steps) / len(steps)  # a uniform symbol of the prefix
    assert chance < 0.06
    assert ig_hits / len(steps) > max(0.35, 8 * chance)
    assert axg_hits / len(steps) > max(0.6, 12 * chance)


# --------------------------------------------------- direct logit attribution, composition
def test_logit_attribution_at_copy_steps_sums_and_is_the_induction_heads(trained, segments,
                                                                         labels):
    model, tok = trained
    second = ap.heads.logit_attribution(model, tok, segments.input_ids, "logit:next",
                                        metric_positions=segments.second_half)
    with torch.no_grad():  # the metric from the model's own logits, read here
        logits = model(segments.input_ids).double()
    following = logits[:, :-1].gather(-1, segments.input_ids[:, 1:, None])[..., 0]
    mask = segments.second_half[:, :-1]
    expected = (following * mask).sum(-1) / mask.sum(-1)
    sums = second.table.groupby("example_id")["value"].sum()
    for b in range(len(expected)):
        assert sums[str(b)] == pytest.approx(float(expected[b]), abs=1e-4, rel=1e-4)

    induction = _heads(labels, "induction")
    parts = second.by_component().set_index("component")["value"]
    names = [f"L{layer}H{head}" for layer, head in induction]
    carried = float(parts[names].sum())
    assert carried > 0.8 * float(expected.mean())  # the induction heads write the answer
    others = parts.drop(names)
    assert min(parts[names]) > 3 * others.abs().max()
    # the control: where nothing can be copied, the induction heads write little of it
    first = ap.heads.logit_attribution(model, tok, segments.input_ids, "logit:next",
                                       metric_positions=segments.first_half)
    control = first.by_component().set_index("component")["value"][names].sum()
    assert control < 0.2 * carried


def test_k_composition_from_previous_token_into_induction_heads_stands_out(trained, labels):
    model, _ = trained
    comp = ap.heads.composition(model)
    assert comp.rope  # RoPE: the weight-based Q/K scores are approximate, and say so
    table = comp.table.assign(ratio=comp.table["score"] / comp.table["baseline"])
    ratio = table.set_index(["kind", "writer_layer", "writer_head", "reader_layer",
                             "reader_head"])["ratio"]
    for writer in _heads(labels, "previous"):
        for reader in _heads(labels, "induction"):
            k = ratio[("k", *writer, *reader)]
            assert k > 1.5  # against random matrices of the same shapes
            assert k > ratio[("q", *writer, *reader)] and k > ratio[("v", *writer, *reader)]

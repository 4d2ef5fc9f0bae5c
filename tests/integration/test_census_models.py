"""Analytic self-tests of the head census on reference models with hand-set weights.

methods.md §13 ("analytic self-tests"): before any trained model is classified, the census must
label heads whose attention is known in closed form. Here the attention parameters of attnprobe's
own reference models are overwritten (under ``torch.no_grad()``) so that chosen heads implement
exactly

* uniform attention (the key projection is zeroed, so every score is 0) -> ``broad``;
* previous-token attention (RoPE with constant q/k peaked at offset -1) -> ``previous``;
* self attention (RoPE peaked at offset 0; ALiBi with a positive slope) -> ``self``;
* a first-token sink (the ``[BOS]`` key made dominant; ALiBi with a negative slope) -> ``sink``.

Every expected score is computed here, in float64, from the construction alone: the scores
``s(i, j)`` each construction puts on query ``i`` and key ``j`` (from the documented RoPE /
ALiBi rules and the weights set below), a softmax over the keys the row may see, and the score
definitions at the top of ``attnprobe/heads/scores.py``. Nothing is copied from a run.

The corpus has six sentences of 17, 18, 20, 23, 25 and 26 tokens (``[BOS]`` included; in-vocab
words only, so no ``[UNK]`` — the stored-maps path treats bracketed tokens as special by their
spelling) and is run with ``batch_size=3``, so every batch is padded. Every model is also run
through ``ap.heads.classify(ap.extract(...))`` (stored, padding-stripped maps), which must give
the same labels and scores as the census, with ``similarity=True`` (weights kept per batch) and
``similarity=False`` (streamed through the capture's reducers).

The constructed heads are sharp but not one-hot (like trained heads); the one-hot limits
(methods.md §13 self-tests 2-4) are checked separately, where ``collapsed`` also fires and must
be listed in ``also`` only.

``repeated=False`` in every census: the default repeated-token probe draws 2 x 50 tokens, longer
than the reference models' 64 positions (see ``test_census_default_probe_fits_reference_models``);
the probe is run separately at length 30 for the previous-token head.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import attnprobe as ap
from attnprobe.heads.probe import repeated_token_scores
from attnprobe.models.induction import repeated_segments
from tests.conftest import track

TEXTS = [  # token counts with [BOS]: 23, 17, 26, 18, 25, 20 (sorted batches: 17-20, 23-26)
    "she gave him a red book about the sea , and he read it at the table after dinner last night .",
    "the cat sat on the mat and the dog sat on the old red chair .",
    "after lunch the children played with a big ball in the park when the rain came , and then "
    "they went home for tea .",
    "the quick brown fox jumped over the lazy dog and then ran into the old house .",
    "the farmer and his family live in a small white house near the river with two dogs , a horse "
    "and many birds .",
    "my mother said that the little bird sang a long song in the garden every morning before "
    "breakfast .",
]
LENGTHS = [23, 17, 26, 18, 25, 20]
BATCH = 3
D_HEAD = 8  # d_model 32 / 4 heads in every reference model used here
ROPE_THETA = [10000.0 ** (-2 * p / D_HEAD) for p in range(D_HEAD // 2)]  # 1, 0.1, 0.01, 0.001

# Exact scores (computed from the construction) vs the census, and census vs stored maps.
EXACT = 1e-6
FLOAT32_ROPE = 1e-5  # float32 RoPE angles, scores up to ~34: weights good to a few 1e-7
CROSS_PATH = 1e-6

ScoreFn = Callable[[int, np.ndarray], np.ndarray]  # (query i, keys j) -> scores s(i, j)


# ---- the analytic side ------------------------------------------------------------------------

def expected_scores(lengths: list[int], score: ScoreFn, *, causal: bool,
                    first_score: ScoreFn | None = None) -> dict[str, float]:
    """Census scores of a head whose pre-softmax scores are ``score(i, j)`` (float64).

    ``first_score`` replaces ``score`` on key 0 (content-based sinks). Means are over every
    real row of every sentence; ``entropy_norm`` only over rows that see more than one key
    (scores.py, reducers.NormalizedEntropy). The sink-free scores follow
    ``attnprobe/heads/sinks.py``: sink keys are key 0 (``[BOS]``, the first token) and every
    key taking more than 0.3 of the mass in more than half of the (at least 4) rows that may
    see it; each sink-free score is a mean over rows weighted by the mass a row has left.
    """
    sums: dict[str, float] = dict.fromkeys(
        ("entropy", "chance_weight", "max_weight", "prev", "self", "next", "first",
         "distance", "sink", "sink_rate", "column_sink"), 0.0)
    free = dict.fromkeys(("prev", "self", "next", "max_weight", "rest"), 0.0)
    free_chance, free_entropy = [0.0, 0.0], [0.0, 0.0]  # (Σ r·value, Σ r)
    normed, n_normed, rows = 0.0, 0, 0
    argmax: dict[int, int] = {}
    free_argmax: dict[int, float] = {}
    for n in lengths:
        weights = np.zeros((n, n))
        for i in range(n):
            keys = np.arange(i + 1 if causal else n)
            s = score(i, keys).astype(np.float64)
            if first_score is not None:
                s[0] = first_score(i, keys[:1])[0]
            w = np.exp(s - s.max())
            weights[i, keys] = w / w.sum()
        seen = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
        seers = seen.sum(0)
        hits = ((weights > 0.3) & seen).sum(0)
        columns = {int(k) for k in np.flatnonzero((hits > 0.5 * seers) & (seers >= 4))}
        sinks = columns | {0}
        for i in range(n):
            keys = np.flatnonzero(seen[i])
            w = weights[i, keys]
            h = float(-(w[w > 0] * np.log(w[w > 0])).sum())
            rows += 1
            sums["entropy"] += h
            if len(keys) > 1:
                normed += h / math.log(len(keys))
                n_normed += 1
            sums["chance_weight"] += 1 / len(keys)
            sums["max_weight"] += float(w.max())
            for name, offset in (("prev", -1), ("self", 0), ("next", 1)):
                sums[name] += float(w[keys == i + offset].sum())
            sums["first"] += float(w[0])
            sums["distance"] += float((w * np.abs(keys - i)).sum())
            top = int(keys[int(w.argmax())]) - i
            argmax[top] = argmax.get(top, 0) + 1
            in_sink = np.isin(keys, list(sinks))
            sink = float(w[in_sink].sum())
            sums["sink"] += sink
            sums["sink_rate"] += sink > 0.3
            sums["column_sink"] += float(w[np.isin(keys, list(columns - {0}))].sum())
            rest_keys, rest_w = keys[~in_sink], w[~in_sink]
            r = float(rest_w.sum())
            free["rest"] += r
            if r <= 0:
                continue
            p = rest_w / r
            for name, offset in (("prev", -1), ("self", 0), ("next", 1)):
                free[name] += r * float(p[rest_keys == i + offset].sum())
            free["max_weight"] += r * float(p.max())
            free_top = int(rest_keys[int(p.argmax())]) - i
            free_argmax[free_top] = free_argmax.get(free_top, 0.0) + r
            free_chance[0] += r / len(rest_keys)
            free_chance[1] += r
            if len(rest_keys) >= 2:
                hp = float(-(p[p > 0] * np.log(p[p > 0])).sum())
                free_entropy[0] += r * hp / math.log(len(rest_keys))
                free_entropy[1] += r
    out = {name: value / rows for name, value in sums.items()}
    out["entropy_norm"] = normed / n_normed
    out["pos_offset"], out["pos_score"] = _most_common(argmax, rows)
    rest = free["rest"]
    for name in ("prev", "self", "next", "max_weight"):
        out[f"{name}_nosink"] = free[name] / rest
    out["chance_weight_nosink"] = free_chance[0] / free_chance[1]
    out["entropy_norm_nosink"] = free_entropy[0] / free_entropy[1]
    out["pos_offset_nosink"], out["pos_score_nosink"] = _most_common(free_argmax, rest)
    return out


def _most_common(argmax: dict[int, float], total: float) -> tuple[float, float]:
    """(offset, share) of the most common argmax offset. The offset is only defined by the
    construction when one offset wins outright (a sink's argmax sits at -i on row i: many
    offsets tie); NaN says "do not compare"."""
    best = max(argmax.values())
    tied = [offset for offset, count in argmax.items() if count == best]
    return (tied[0] if len(tied) == 1 else float("nan")), best / total


def uniform(i: int, keys: np.ndarray) -> np.ndarray:
    return np.zeros(len(keys))


def rope_kernel(strengths: tuple[float, float], delta: int) -> ScoreFn:
    """``s(i, j) = S0 cos(θ0 (i - j - δ)) + S1 cos(θ1 (i - j - δ))``: what
    :func:`rope_qk` produces (module docstring of ``attnprobe/models/positional.py``: q and k
    rotated by ``position · θ_p``, half-split pairs, ``θ_p = 10000^(-2p/d)``)."""
    def score(i: int, keys: np.ndarray) -> np.ndarray:
        d = i - keys - delta
        return sum(s * np.cos(ROPE_THETA[p] * d) for p, s in enumerate(strengths))
    return score


def alibi(slope: float) -> ScoreFn:
    """ALiBi with zero q/k: ``s(i, j) = -slope · |i - j|``."""
    return lambda i, keys: -slope * np.abs(i - keys).astype(np.float64)


# ---- the construction side --------------------------------------------------------------------

def reference(name: str) -> tuple[torch.nn.Module, object]:
    model, tok = ap.load_model(f"ref:{name}")
    assert model.n_heads * D_HEAD == model.config.d_model  # the head size assumed here
    return track(model), tok


def head_rows(head: int) -> slice:
    return slice(head * D_HEAD, (head + 1) * D_HEAD)


@torch.no_grad()
def set_projection(proj: torch.nn.Linear, head: int, bias: torch.Tensor | None = None,
                   weight: torch.Tensor | None = None) -> None:
    """Rows of ``head`` in a q/k projection: weight (default 0) and bias (default 0)."""
    rows = head_rows(head)
    proj.weight[rows] = 0.0 if weight is None else weight
    proj.bias[rows] = 0.0 if bias is None else bias


def rope_qk(strengths: tuple[float, float], delta: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Constant q and k (biases, zero weights) whose RoPE score is :func:`rope_kernel`.

    Pair p (features p and p + 4) of q is ``(a_p, 0)`` and of k is
    ``a_p (cos δθ_p, sin δθ_p)`` with ``a_p² = S_p √d``: rotated to positions i and j,
    ``q·k / √d = S_p cos(θ_p (i - j - δ))``, largest at ``j = i - δ``.
    """
    q, k = torch.zeros(D_HEAD), torch.zeros(D_HEAD)
    for p, strength in enumerate(strengths):
        a = math.sqrt(strength * math.sqrt(D_HEAD))
        q[p] = a
        k[p], k[p + D_HEAD // 2] = a * math.cos(delta * ROPE_THETA[p]), a * math.sin(
            delta * ROPE_THETA[p])
    return q, k


@dataclass(frozen=True)
class Built:
    model: torch.nn.Module
    tok: object
    heads: dict[int, tuple[str, dict[str, float]]]  # layer-0 head -> (label, expected scores)
    tolerance: float


PREV = (10.0, 24.0)  # RoPE strengths S0, S1 of the previous-token head (build_rope_layer)
SELF = (8.0, 19.2)
SINK_GAP = 3.0  # the [BOS] key scores +3 and every other key -3 (times the RoPE cos factor)


def build_rope_layer() -> Built:
    """``ref:rope`` (bidirectional, RoPE) with the four heads of layer 0 set by hand.

    * head 0, uniform: k = 0.
    * head 1, previous token: :func:`rope_qk` with ``S = (10, 24)`` and δ = 1. With only
      ``θ0 = 1`` the kernel ``cos(d)`` nearly repeats at ``d = ±6`` (cos 6 = 0.96); the θ1 = 0.1
      term (``S1 = 2.4 S0``) makes the gaps at ``d = ±1`` and ``d = ±6`` about equal (0.47 S0).
      The strength keeps the head sharp (``prev`` > 0.9) without being one-hot, like a
      trained previous-token head (the one-hot limit: ``test_one_hot_heads_keep_their_label``).
    * head 2, first-token sink: every token embedding is set to ``u = (1, -1, 1, -1, ...)``
      and ``[BOS]``'s to ``-u`` (mean 0, variance 1, so ``ln1`` with weight 1 and bias 0 gives
      ``±u / sqrt(1 + eps)``); k reads ``-u`` on RoPE pair 3 (θ3 = 0.001, a near-constant
      rotation) and q is a constant on the same pair, so the score is
      ``±3 cos(θ3 (i - j)) / sqrt(1 + eps)``, + on the ``[BOS]`` key.
    * head 3, self: :func:`rope_qk` with ``S = (8, 19.2)`` and δ = 0.
    """
    model, tok = reference("rope")
    block = model.blocks[0]
    attn = block.attn
    eps = block.ln1.eps
    with torch.no_grad():
        set_projection(attn.k_proj, 0)
        set_projection(attn.q_proj, 0)
        for head, (strengths, delta) in {1: (PREV, 1), 3: (SELF, 0)}.items():
            q, k = rope_qk(strengths, delta)
            set_projection(attn.q_proj, head, bias=q)
            set_projection(attn.k_proj, head, bias=k)
        d_model = model.config.d_model
        u = torch.tensor([(-1.0) ** m for m in range(d_model)])
        model.embed.weight[:] = u
        model.embed.weight[tok.bos_token_id] = -u
        block.ln1.weight.fill_(1.0)
        block.ln1.bias.zero_()
        a = math.sqrt(SINK_GAP * math.sqrt(D_HEAD))
        q = torch.zeros(D_HEAD)
        q[3] = a
        k_weight = torch.zeros(D_HEAD, d_model)
        k_weight[3] = -a * u / d_model  # k[3] = +a on [BOS] (-u), -a elsewhere, / sqrt(1+eps)
        set_projection(attn.q_proj, 2, bias=q)
        set_projection(attn.k_proj, 2, weight=k_weight)

    def sink(sign: float) -> ScoreFn:
        scale = sign * SINK_GAP / math.sqrt(1 + eps)
        return lambda i, keys: scale * np.cos(ROPE_THETA[3] * (i - keys))

    heads = {
        0: ("broad", expected_scores(LENGTHS, uniform, causal=False)),
        1: ("previous", expected_scores(LENGTHS, rope_kernel(PREV, 1), causal=False)),
        2: ("sink", expected_scores(LENGTHS, sink(-1.0), causal=False, first_score=sink(1.0))),
        3: ("self", expected_scores(LENGTHS, rope_kernel(SELF, 0), causal=False)),
    }
    return Built(model, tok, heads, FLOAT32_ROPE)


ALIBI_SELF, ALIBI_SINK = 3.0, -3.0


def build_alibi_layer() -> Built:
    """``ref:alibi`` (causal, ALiBi ``-slope·|i - j|``) with q = k = 0 on heads 0-2 of layer 0
    and their slopes overwritten (a buffer): head 0 slope +3 (self), head 1 slope -3 (the
    bias grows with distance, so the first key wins: a first-token sink), head 2 slope 0
    (uniform over the causal prefix). Head 3 keeps its random weights."""
    model, tok = reference("alibi")
    attn = model.blocks[0].attn
    slopes = {0: ALIBI_SELF, 1: ALIBI_SINK, 2: 0.0}
    with torch.no_grad():
        for head, slope in slopes.items():
            set_projection(attn.q_proj, head)
            set_projection(attn.k_proj, head)
            attn.slopes[head] = slope
    heads = {
        0: ("self", expected_scores(LENGTHS, alibi(ALIBI_SELF), causal=True)),
        1: ("sink", expected_scores(LENGTHS, alibi(ALIBI_SINK), causal=True)),
        2: ("broad", expected_scores(LENGTHS, uniform, causal=True)),
    }
    return Built(model, tok, heads, EXACT)


def build_gqa_uniform() -> Built:
    """``ref:transformer`` (causal, learned positions, 4 query heads on 2 key/value heads):
    zeroing key/value head 0's key projection makes query heads 0 and 1 uniform whatever
    their queries."""
    model, tok = reference("transformer")
    assert model.config.n_kv_heads == 2
    with torch.no_grad():
        set_projection(model.blocks[0].attn.k_proj, 0)
    expected = expected_scores(LENGTHS, uniform, causal=True)
    return Built(model, tok, {0: ("broad", expected), 1: ("broad", expected)}, EXACT)


def build_bidirectional_uniform() -> Built:
    """``ref:encoder`` (bidirectional, learned positions): head 2 of layer 0 with k = 0."""
    model, tok = reference("encoder")
    with torch.no_grad():
        set_projection(model.blocks[0].attn.k_proj, 2)
    return Built(model, tok, {2: ("broad", expected_scores(LENGTHS, uniform, causal=False))},
                 EXACT)


BUILDERS = {"rope": build_rope_layer, "alibi": build_alibi_layer,
            "gqa-uniform": build_gqa_uniform, "encoder-uniform": build_bidirectional_uniform}


# ---- running the census -----------------------------------------------------------------------

def run_census(built: Built, *, similarity: bool = True):
    """``similarity=True`` keeps each batch's weights (head distances) and tallies them per
    batch; ``similarity=False`` streams them through the capture's reducers: both paths."""
    return ap.heads.census(built.model, built.tok, TEXTS, batch_size=BATCH, repeated=False,
                           similarity=similarity)


def layer0(table, head: int):
    rows = table[(table["layer"] == 0) & (table["head"] == head)]
    assert len(rows) == 1
    return rows.iloc[0]


COMPARED = ("entropy", "entropy_norm", "chance_weight", "max_weight", "prev", "self", "next",
            "first", "distance", "pos_score", "sink", "sink_rate", "column_sink", "prev_nosink",
            "self_nosink", "next_nosink", "max_weight_nosink", "chance_weight_nosink",
            "entropy_norm_nosink", "pos_score_nosink")


def test_corpus_lengths_are_what_the_expectations_assume():
    _, tok = reference("rope")
    ids = [tok.encode(text) for text in TEXTS]
    assert [len(i) for i in ids] == LENGTHS
    assert all(tok.unk_token_id not in i for i in ids)
    batches = [sorted(LENGTHS)[i:i + BATCH] for i in range(0, len(LENGTHS), BATCH)]
    assert all(len(set(b)) == BATCH for b in batches)  # every census batch is padded


@pytest.mark.parametrize("similarity", [True, False], ids=["kept", "streamed"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_census_scores_and_labels_match_the_construction(name, similarity):
    """Every score of every constructed head equals its closed form, and the label is the
    pattern's (not ``collapsed``, not ``vertical+diagonal``)."""
    built = BUILDERS[name]()
    table = run_census(built, similarity=similarity).classify()
    for head, (label, expected) in built.heads.items():
        row = layer0(table, head)
        where = f"{name} L0H{head}"
        for column in COMPARED:
            assert row[column] == pytest.approx(expected[column], abs=built.tolerance), (
                f"{where} {column}")
        if label != "broad" and not math.isnan(expected["pos_offset"]):  # uniform: any argmax
            assert row["pos_offset"] == expected["pos_offset"], where
        assert row["label"] == label, f"{where}: {row['label']} ({row['evidence']})"


def test_uniform_heads_are_broad_with_exact_entropy():
    """Uniform rows: ``entropy`` is the mean of ``ln(visible keys)``, computed here from the
    sentence lengths alone (causal row i sees i + 1 keys, bidirectional rows see n);
    ``entropy_norm`` is 1 and ``max_weight`` is ``chance_weight``."""
    cases = [(build_bidirectional_uniform(), 2, False), (build_gqa_uniform(), 0, True),
             (build_gqa_uniform(), 1, True), (build_alibi_layer(), 2, True),
             (build_rope_layer(), 0, False)]
    n_rows = sum(LENGTHS)
    for built, head, causal in cases:
        if causal:
            entropy = sum(math.lgamma(n + 1) for n in LENGTHS) / n_rows  # Σ_i ln(i+1) = ln n!
            chance = sum(sum(1 / k for k in range(1, n + 1)) for n in LENGTHS) / n_rows
        else:
            entropy = sum(n * math.log(n) for n in LENGTHS) / n_rows
            chance = len(LENGTHS) / n_rows
        row = layer0(run_census(built).classify(), head)
        assert row["entropy"] == pytest.approx(entropy, abs=EXACT)
        assert row["entropy_norm"] == pytest.approx(1.0, abs=EXACT)
        assert row["chance_weight"] == pytest.approx(chance, abs=EXACT)
        assert row["max_weight"] == pytest.approx(row["chance_weight"], abs=EXACT)
        assert row["label"] == "broad", row["evidence"]
        assert row["evidence"].startswith("entropy_norm_nosink=1 >= 0.78")
        # key 0 is a sink key: the rest is uniform over the other keys
        assert row["sink"] == pytest.approx(row["first"], abs=EXACT)


def test_previous_token_head():
    built = build_rope_layer()
    expected = built.heads[1][1]
    assert expected["prev"] > 0.9 and expected["pos_offset"] == -1  # the construction's regime
    assert expected["entropy_norm"] > 0.05 and expected["max_weight"] < 0.95  # not one-hot
    row = layer0(run_census(built).classify(), 1)
    assert row["label"] == "previous"
    assert row["evidence"].startswith("prev_nosink=")
    assert row["prev"] > 0.9
    assert row["pos_offset"] == -1
    # Rows 1.. put their largest weight on i-1; row 0 (no previous key) looks elsewhere.
    assert row["pos_score"] == pytest.approx((sum(LENGTHS) - len(LENGTHS)) / sum(LENGTHS),
                                             abs=EXACT)


def test_previous_token_head_on_repeated_tokens():
    """The repeated-token probe, at 2 x 30 tokens (within the models' 64 positions): the
    positional head ignores content, so ``rep_prev`` is the mean over rows 1..59 of one
    60-token sequence's previous-token weight (no special token in the probe's input)."""
    built = build_rope_layer()
    length = 30
    score = rope_kernel(PREV, 1)
    weights = []
    for i in range(1, 2 * length):
        s = score(i, np.arange(2 * length))
        w = np.exp(s - s.max())
        weights.append(w[i - 1] / w.sum())
    expected = float(np.mean(weights))
    assert expected > 0.9
    summary = repeated_token_scores(built.model, built.tok, length=length,
                                    n_sequences=4).summary()
    row = layer0(summary, 1)
    assert row["rep_prev"] == pytest.approx(expected, abs=FLOAT32_ROPE)
    assert row["rep_prev"] > 0.9


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_sink_head(name):
    built = BUILDERS[name]()
    head = 2 if name == "rope" else 1
    expected = built.heads[head][1]
    assert expected["first"] > 0.9 and expected["entropy_norm"] > 0.05
    row = layer0(run_census(built).classify(), head)
    assert row["label"] == "sink"
    assert row["first"] > 0.9
    assert row["bos"] == pytest.approx(row["first"], abs=EXACT)  # [BOS] is always first
    assert re.fullmatch(r"sink=0\.9\d* > 0\.6, (first|bos)=0\.9\d*", row["evidence"]), \
        row["evidence"]
    # under 5 % of the mass is left after the sink: the sink-free rules do not read it
    assert 1 - row["sink"] < 0.05 and row["also"] == ""


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_self_head(name):
    built = BUILDERS[name]()
    head = 3 if name == "rope" else 0
    row = layer0(run_census(built).classify(), head)
    assert row["label"] == "self"
    assert row["self"] == pytest.approx(built.heads[head][1]["self"], abs=built.tolerance)
    assert row["self"] > 0.9
    assert row["pos_offset"] == 0


def test_layer_profile_of_the_hand_built_layer():
    profile = run_census(build_rope_layer()).layer_profile()
    layer = profile[profile["layer"] == 0].iloc[0]
    assert layer["n_heads"] == 4
    for label in ("broad", "previous", "sink", "self"):
        assert layer[f"share_{label}"] == pytest.approx(0.25), label


@pytest.mark.parametrize("similarity", [True, False], ids=["kept", "streamed"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_stored_maps_give_the_census_labels_and_scores(name, similarity):
    """``ap.heads.classify(ap.extract(...))`` (padding-stripped stored maps, batches in input
    order) against the census (length-sorted padded batches): every head, every score, to
    1e-6."""
    built = BUILDERS[name]()
    streamed = run_census(built, similarity=similarity).classify()
    stored = ap.heads.classify(ap.extract(built.model, built.tok, TEXTS, batch_size=BATCH))
    keys = ["stack", "kind", "layer", "head", "head_id"]
    assert streamed[keys].equals(stored[keys])
    assert list(streamed["label"]) == list(stored["label"])
    assert list(streamed["also"]) == list(stored["also"])
    assert sorted(streamed.columns) == sorted(stored.columns)
    assert list(streamed["family"]) == list(stored["family"])
    numeric = [c for c in streamed.columns
               if c not in (*keys, "label", "family", "evidence", "also")]
    for column in numeric:
        np.testing.assert_allclose(stored[column].to_numpy(float),
                                   streamed[column].to_numpy(float), rtol=0, atol=CROSS_PATH,
                                   err_msg=f"{name} {column}")
    for head, (label, _) in built.heads.items():
        assert layer0(stored, head)["label"] == label


# ---- the one-hot limit ------------------------------------------------------------------------

ONE_HOT = [
    # (model, head, constructed pattern (methods.md §13 self-test), label, score, its value,
    #  also): a one-hot target that is no sink leaves one-hot rows after the sinks, so
    # ``collapsed`` fires too; a one-hot sink leaves nothing to judge
    ("alibi", 0, "identity (self-test 2)", "self", "self", 1.0, "collapsed"),
    ("alibi", 1, "column 0 (self-test 4)", "sink", "first", 1.0, ""),
    ("rope", 1, "sub-diagonal (self-test 3)", "previous", "prev",
     (sum(LENGTHS) - len(LENGTHS)) / sum(LENGTHS), "collapsed"),
]


def build_one_hot(name: str) -> Built:
    """The same constructions in the one-hot limit: ALiBi slopes ±30 (e^-30 ≈ 1e-13 on the
    next key, no float32 underflow), RoPE strengths x4 (gap ≥ 18 on every competing key).
    Head 3 of the ALiBi layer (random) and head 0 of the RoPE layer (uniform) keep every key
    above 0 for the streaming count of visible keys."""
    if name == "alibi":
        built = build_alibi_layer()
        with torch.no_grad():
            built.model.blocks[0].attn.slopes[0] = 30.0
            built.model.blocks[0].attn.slopes[1] = -30.0
        return built
    built = build_rope_layer()
    q, k = rope_qk(tuple(4 * s for s in PREV), 1)
    attn = built.model.blocks[0].attn
    with torch.no_grad():
        set_projection(attn.q_proj, 1, bias=q)
        set_projection(attn.k_proj, 1, bias=k)
    return built


@pytest.mark.parametrize(("name", "head", "pattern", "label", "column", "value", "also"),
                         ONE_HOT)
def test_one_hot_heads_keep_their_label(name, head, pattern, label, column, value, also):
    """methods.md §13 self-tests 2-4: identity -> self, column 0 -> sink, sub-diagonal (row 0
    elsewhere) -> prev = (n - 1) / n summed over sentences. The rows are one-hot, so the
    ``collapsed`` rule fires on the mass left after the sink (the first token) for the
    identity and sub-diagonal heads; labels.py ranks it after the positional labels and lists
    it in ``also``. The column-0 head has no mass left (under ``min_rest``): ``sink`` alone."""
    built = build_one_hot(name)
    row = layer0(run_census(built).classify(), head)
    assert row[column] == pytest.approx(value, abs=1e-4), pattern
    assert row["entropy_norm"] < 0.05 and row["max_weight"] > 0.95, pattern
    assert row["label"] == label, f"{pattern}: {row['label']} ({row['evidence']})"
    assert row["also"] == also, pattern
    stored = layer0(ap.heads.classify(ap.extract(built.model, built.tok, TEXTS,
                                                 batch_size=BATCH)), head)
    assert (stored["label"], stored["also"]) == (row["label"], row["also"])


# ---- known gaps (library issues found by these tests) -------------------------------------------

def test_census_default_probe_fits_reference_models():
    built = build_rope_layer()
    table = ap.heads.census(built.model, built.tok, TEXTS, batch_size=BATCH).scores()
    assert "rep_prev" in table.columns


SHORT = ["the cat sat on the mat .", "a dog ran in the park .", "we like tea ."]  # 8, 8, 5


def test_causal_uniform_head_is_broad_on_short_sentences():
    """methods.md §13 self-test 1 (uniform -> broad) has no length condition."""
    built = build_gqa_uniform()
    lengths = [8, 8, 5]
    row = layer0(ap.heads.census(built.model, built.tok, SHORT, batch_size=BATCH,
                                 repeated=False).classify(), 0)
    expected = expected_scores(lengths, uniform, causal=True)
    for column in ("entropy_norm", "first", "self", "chance_weight", "max_weight"):
        assert row[column] == pytest.approx(expected[column], abs=EXACT), column
    assert row["label"] == "broad", f"{row['label']} ({row['evidence']})"


@pytest.mark.parametrize("similarity", [False, True])
def test_underflowing_layer_gives_the_same_scores_streamed_and_stored(similarity):
    """Every head of ALiBi layer 0 is an identity head with slope 200: e^-200 underflows to 0
    in float32, so each row's weights are exactly one-hot and cannot tell how many keys the
    row could see; the hook seam reads it from the model's declared causal mask, as the
    stored maps do (``info.causal``)."""
    model, tok = reference("alibi")
    attn = model.blocks[0].attn
    with torch.no_grad():
        for head in range(model.n_heads):
            set_projection(attn.q_proj, head)
            set_projection(attn.k_proj, head)
            attn.slopes[head] = 200.0
    streamed = layer0(ap.heads.census(model, tok, TEXTS, batch_size=BATCH, repeated=False,
                                      similarity=similarity).classify(), 0)
    stored = layer0(ap.heads.classify(ap.extract(model, tok, TEXTS, batch_size=BATCH)), 0)
    chance = sum(sum(1 / k for k in range(1, n + 1)) for n in LENGTHS) / sum(LENGTHS)
    for row in (stored, streamed):
        assert row["chance_weight"] == pytest.approx(chance, abs=EXACT)
        assert row["entropy_norm"] == pytest.approx(0.0, abs=EXACT)
        assert row["label"] == "self" and row["also"] == "collapsed"


def test_stored_maps_match_the_census_with_unknown_words():
    built = build_bidirectional_uniform()
    texts = ["the zebra sat on the xylophone .", "a dog ran in the park .", "we like tea ."]
    streamed = ap.heads.census(built.model, built.tok, texts, batch_size=BATCH,
                               repeated=False).classify()
    stored = ap.heads.classify(ap.extract(built.model, built.tok, texts, batch_size=BATCH))
    for column in ("special", "duplicate"):
        np.testing.assert_allclose(stored[column].to_numpy(float),
                                   streamed[column].to_numpy(float), rtol=0, atol=CROSS_PATH,
                                   err_msg=column)


# ---- a trained decoder: ref:induction ---------------------------------------------------------

@pytest.fixture(scope="module")
def induction_run():
    """``ref:induction`` (cached weights; trained once when missing) on 48 of its own training
    sequences (a random segment repeated later), with the probe at 20 tokens per copy."""
    model, tok = ap.load_model("ref:induction")
    track(model)
    segments = repeated_segments(48, torch.Generator().manual_seed(7), tok)
    texts = [" ".join(tok.convert_ids_to_tokens(ids[1:].tolist()))
             for ids in segments.input_ids]
    table = ap.heads.census(model, tok, texts, similarity=False, probe_length=20).classify()
    return model, tok, texts, table


def test_ref_induction_keeps_its_previous_and_induction_heads(induction_run):
    """The known circuit: previous-token heads in layer 0, induction heads in layer 1, with
    the first-token sink set aside rather than winning."""
    _, _, _, table = induction_run
    layer_0, layer_1 = table[table["layer"] == 0], table[table["layer"] == 1]
    previous = layer_0[layer_0["label"] == "previous"]
    assert len(previous) >= 1 and (previous["family"] == "local").all()
    assert (layer_1["label"] == "induction").all(), layer_1[["head_id", "label", "evidence"]]
    assert (layer_1["family"] == "copying").all()
    assert not (layer_0["label"] == "induction").any()
    assert not (table["label"] == "sink").any()


def test_ref_induction_sink_free_previous_mass_matches_the_maps(induction_run):
    """``prev_nosink`` of the previous-token heads, recomputed from extracted maps: no key but
    the first takes more than 0.3 in most rows, so the sink is key 0 alone and the score is
    Σ_i a[i, i-1] (i ≥ 2) / Σ_i (1 - a[i, 0]) over every row of every sequence."""
    model, tok, texts, table = induction_run
    maps = ap.extract(model, tok, texts)
    for _, row in table[table["label"] == "previous"].iterrows():
        on_prev = rest = sink = rows = 0.0
        for amap in maps:
            a = amap.pattern[int(row["layer"]), int(row["head"])].double()  # [query, key]
            n = a.shape[0]
            seers = torch.arange(n, 0, -1, dtype=torch.float64)  # causal: n - k rows see key k
            hits = ((a > 0.3).sum(0) > 0.5 * seers) & (seers >= 4)
            assert not hits[1:].any()  # no column sink besides the first token
            on_prev += float(a.diagonal(-1)[1:].sum())
            rest += float((1 - a[:, 0]).sum())
            sink += float(a[:, 0].sum())
            rows += n
        assert row["prev_nosink"] == pytest.approx(on_prev / rest, abs=1e-5)
        assert row["sink"] == pytest.approx(sink / rows, abs=1e-5)
        assert row["prev_nosink"] > row["prev"]  # the sink's mass no longer dilutes it


def test_ref_induction_stored_maps_give_the_census_labels(induction_run):
    model, tok, texts, _ = induction_run
    census = ap.heads.census(model, tok, texts, repeated=False).classify()
    stored = ap.heads.classify(ap.extract(model, tok, texts))
    assert list(census["label"]) == list(stored["label"])
    assert list(census["also"]) == list(stored["also"])
    for column in ("sink", "prev_nosink", "entropy_norm_nosink", "pos_score_nosink"):
        np.testing.assert_allclose(stored[column].to_numpy(float),
                                   census[column].to_numpy(float), rtol=0, atol=CROSS_PATH)

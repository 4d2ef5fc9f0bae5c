"""The causal section of ``analyses/induction_circuit.py``: what the induction circuit
predicts for each causal method of attnprobe, measured on ``ref:induction``.

Clean inputs are held-out sequences with a repeated segment; each corrupted input keeps the
second copy and everything after it but draws every symbol before it afresh, so only the
clean input can be continued by copying (same length, so the two runs align). The metric is
the correct next token's logit (``logit:next``) averaged over the second-copy positions.

- **Activation patching** (denoising, each head's output from the clean run into the
  corrupted one): the induction heads restore far more of the clean metric than any other
  head.
- **Path patching** (noising: in the clean run, the previous-token heads' corrupted outputs
  reach only the induction heads' queries, keys or values): the keys carry the circuit.
- **Attention knockout** in layer 1: blocking only the edges from each second-copy token to
  the token after its earlier copy drops copy accuracy to near chance; blocking as many
  random visible edges of the same rows does not.
- **Direct logit attribution** at the copy steps: the induction heads carry most of the
  heads' direct contribution to the correct logit.
- **K-composition** from the previous-token heads into the induction heads, against the
  random-matrix baseline and against the other layer-0 heads.
- **Attribution patching** next to the real activation patching: their correlation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd
import torch

import attnprobe as ap
from attnprobe.capture import Knockout
from attnprobe.models.induction import N_SYMBOLS, SYMBOLS, Segments
from attnprobe.tasks.induction import copy_scores, segment_texts

Head = tuple[int, int]
METRIC = "logit:next"
CORRUPTION_SEED = 7_777  # added to the data's seed


@dataclass(frozen=True)
class CausalInputs:
    """Clean and corrupted texts, the second-copy positions (``[batch, seq]`` bool, the
    metric's positions) and the segments behind them."""

    clean: list[str]
    corrupt: list[str]
    positions: torch.Tensor
    segments: Segments


def corrupted(segments: Segments, tokenizer, seed: int) -> Segments:
    """The same sequences with every symbol before the second copy drawn afresh (from a
    generator of its own: the held-out data's seed would draw the same symbols again)."""
    generator = torch.Generator().manual_seed(seed + CORRUPTION_SEED)
    ids = segments.input_ids.clone()
    first_id = tokenizer.convert_tokens_to_ids([SYMBOLS[0]])[0]
    starts = torch.where(segments.second_half, torch.arange(ids.shape[1]), ids.shape[1]
                         ).amin(-1)  # [batch]: the second copy's first position
    fresh = first_id + torch.randint(0, N_SYMBOLS, ids.shape, generator=generator)
    before = (torch.arange(ids.shape[1])[None, :] < starts[:, None]) & \
        (torch.arange(ids.shape[1])[None, :] > 0)  # [BOS] stays
    return replace(segments, input_ids=torch.where(before, fresh, ids))


def causal_inputs(segments: Segments, tokenizer, seed: int) -> CausalInputs:
    return CausalInputs(segment_texts(segments, tokenizer),
                        segment_texts(corrupted(segments, tokenizer, seed), tokenizer),
                        segments.second_half.clone(), segments)


def _mean_effect(table: pd.DataFrame) -> pd.DataFrame:
    summary = ap.patch.summary(table)
    return summary[["layer", "head", "effect"]].assign(
        head_id=[ap.head_id(int(r.layer), int(r.head)) for r in summary.itertuples()])


def activation_patching(model, tok, inputs: CausalInputs, induction: Sequence[Head]
                        ) -> tuple[pd.DataFrame, dict[str, float]]:
    """Each head's output patched clean → corrupted, next to its attribution estimate."""
    common = {"metric_positions": inputs.positions, "batch_size": len(inputs.clean)}
    real = ap.patch.heads(model, tok, inputs.clean, inputs.corrupt, METRIC, **common)
    estimate = ap.patch.attribution(model, tok, inputs.clean, inputs.corrupt, METRIC, **common)
    agreement = ap.patch.agreement(estimate, real)
    table = _mean_effect(real).merge(
        _mean_effect(estimate).rename(columns={"effect": "attribution_effect"}),
        on=["layer", "head", "head_id"])
    table["induction_head"] = [(int(r.layer), int(r.head)) in set(induction)
                               for r in table.itertuples()]
    inside = table.loc[table["induction_head"], "effect"]
    outside = table.loc[~table["induction_head"], "effect"]
    return table, {"patching: induction heads' mean effect": float(inside.mean()),
                   "patching: best other head's effect": float(outside.max()),
                   "attribution vs activation patching: pearson": agreement.pearson,
                   "attribution vs activation patching: spearman": agreement.spearman}


def path_patching(model, tok, inputs: CausalInputs, previous: Sequence[Head],
                  induction: Sequence[Head]) -> pd.DataFrame:
    """Noising: the previous-token heads' corrupted outputs reach only the induction heads'
    queries, keys or values (all senders at once); effect 1 = the whole clean−corrupt
    difference destroyed."""
    rows = []
    for into in ("q", "k", "v"):
        table = ap.patch.path(model, tok, inputs.clean, inputs.corrupt, METRIC,
                              senders=_scope(previous), receivers=_scope(induction),
                              into=into, direction="noising", per="scope",
                              metric_positions=inputs.positions,
                              batch_size=len(inputs.clean))
        rows.append({"into": into, "effect": float(ap.patch.summary(table)["effect"].mean())})
    return pd.DataFrame(rows)


def _scope(heads: Sequence[Head]) -> str:
    return "heads:" + ",".join(f"{layer}.{head}" for layer, head in heads)


def knockout_edges(segments: Segments, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[batch, query, key]`` bool: each second-copy position's edge to the token after its
    earlier copy, and as many random edges of the same rows (a visible key that is neither
    that token nor the row itself)."""
    n, seq = segments.input_ids.shape
    target = torch.zeros(n, seq, seq, dtype=torch.bool)
    rows, cols = segments.second_half.nonzero(as_tuple=True)
    target[rows, cols, segments.source[rows, cols] + 1] = True
    generator = torch.Generator().manual_seed(seed)
    random = torch.zeros_like(target)
    for b, q in zip(rows.tolist(), cols.tolist(), strict=True):
        choices = [k for k in range(q) if not target[b, q, k]]  # keys < q: visible, not self
        random[b, q, choices[int(torch.randint(len(choices), (1,), generator=generator))]] = True
    return target, random


def knockout(model, segments: Segments, layer: int, seed: int) -> pd.DataFrame:
    """Second-copy accuracy with nothing, the copy edges, or as many random edges blocked in
    ``layer`` (every head), one forward over all sequences each."""
    target, random = knockout_edges(segments, seed)
    rows = []
    for name, edges in (("none", None), ("copy edges", target), ("random edges", random)):
        if edges is None:
            scores = copy_scores(model, segments, batch_size=len(segments.input_ids))
        else:
            def blocked(at: int, shape: torch.Size, edges: torch.Tensor = edges):
                return edges[:, None] if at == layer else None
            with ap.capture(model, f"layer:{layer}", parts=[Knockout(blocked)]):
                scores = copy_scores(model, segments, batch_size=len(segments.input_ids))
        second = scores.set_index("half").loc["second"]
        rows.append({"blocked": name, "edges": 0 if edges is None else int(edges.sum()),
                     "second_accuracy": float(second["accuracy"]),
                     "second_loss": float(second["loss"])})
    table = pd.DataFrame(rows)
    table["chance"] = 1 / N_SYMBOLS
    return table


def logit_attribution(model, tok, inputs: CausalInputs, induction: Sequence[Head]
                      ) -> tuple[pd.DataFrame, float]:
    """Each head's direct part of the correct next-token logit at the copy steps, and the
    induction heads' share of the heads' total (by absolute value)."""
    dla = ap.heads.logit_attribution(model, tok, inputs.clean, METRIC,
                                     metric_positions=inputs.positions,
                                     batch_size=len(inputs.clean))
    heads = _long_heads(dla.by_head())
    heads["induction_head"] = [(int(r.layer), int(r.head)) in set(induction)
                               for r in heads.itertuples()]
    magnitude = heads["value"].abs()
    return heads, float(magnitude[heads["induction_head"]].sum() / magnitude.sum())


def _long_heads(by_head: pd.DataFrame) -> pd.DataFrame:
    """``layer, head, value`` from a layer × head frame."""
    long = by_head.stack().rename("value").reset_index()
    long.columns = ["layer", "head", "value"]
    return long.astype({"layer": int, "head": int})


def k_composition(model, previous: Sequence[Head], induction: Sequence[Head]
                  ) -> tuple[pd.DataFrame, dict[str, float]]:
    """K-composition ratios (score / random baseline) of every layer-0 head into the
    induction heads."""
    table = ap.heads.composition(model).table
    k = table[(table["kind"] == "k")
              & table.apply(lambda r: (int(r.reader_layer), int(r.reader_head))
                            in set(induction), axis=1)]
    k = k.assign(ratio=k["score"] / k["baseline"])
    by_writer = k.groupby(["writer_layer", "writer_head"])["ratio"].mean().reset_index()
    by_writer["previous_head"] = [(int(r.writer_layer), int(r.writer_head)) in set(previous)
                                  for r in by_writer.itertuples()]
    inside = by_writer.loc[by_writer["previous_head"], "ratio"]
    outside = by_writer.loc[~by_writer["previous_head"], "ratio"]
    return by_writer, {"K-composition ratio: previous-token heads → induction heads":
                       float(inside.mean()),
                       "K-composition ratio: other layer-0 heads → induction heads":
                       float(outside.mean()) if len(outside) else float("nan")}


def causal_section(model, tok, segments: Segments, labels: pd.DataFrame, seed: int
                   ) -> dict[str, pd.DataFrame]:
    """Every causal method on ``segments`` with the census's head sets (``labels``): the
    tables, and ``causal``: each prediction of the circuit, the measured figure and whether
    it holds."""
    def heads_of(label: str) -> list[Head]:
        return [(int(r.layer), int(r.head)) for r in labels.itertuples() if r.label == label]

    previous, induction = heads_of("previous"), heads_of("induction")
    if not previous or not induction:
        return {"causal": pd.DataFrame([{"prediction": "the census finds previous-token and "
                                         "induction heads", "value": float("nan"),
                                         "holds": False}])}
    inputs = causal_inputs(segments, tok, seed)
    patching, figures = activation_patching(model, tok, inputs, induction)
    paths = path_patching(model, tok, inputs, previous, induction)
    knocked = knockout(model, segments, max(layer for layer, _ in induction), seed)
    dla, induction_share = logit_attribution(model, tok, inputs, induction)
    composition, ratios = k_composition(model, previous, induction)
    into = paths.set_index("into")["effect"]
    accuracy = knocked.set_index("blocked")["second_accuracy"]
    floor = 0.01  # effects this small are noise: a ratio over them says nothing
    predictions = [
        ("patching: induction heads' mean effect / best other head's (> 5)",
         figures["patching: induction heads' mean effect"]
         / max(figures["patching: best other head's effect"], floor), 5),
        ("path noising through the induction heads' keys / through queries or values (> 5)",
         into["k"] / max(abs(into["q"]), abs(into["v"]), floor), 5),
        ("knockout of the copy edges: second-copy accuracy / chance (< 3)",
         accuracy["copy edges"] / (1 / N_SYMBOLS), -3),
        ("knockout of as many random edges: accuracy kept (share of none, > 0.9)",
         accuracy["random edges"] / accuracy["none"], 0.9),
        ("DLA at copy steps: induction heads' share of |head contributions| (> 0.9)",
         induction_share, 0.9),
        ("K-composition: previous-token heads → induction heads over the random baseline (> 1)",
         ratios["K-composition ratio: previous-token heads → induction heads"], 1),
        ("K-composition: previous-token heads over the other layer-0 heads (> 1)",
         ratios["K-composition ratio: previous-token heads → induction heads"]
         / ratios["K-composition ratio: other layer-0 heads → induction heads"], 1),
        ("attribution patching vs activation patching: pearson over heads (> 0.9)",
         figures["attribution vs activation patching: pearson"], 0.9),
    ]
    causal = pd.DataFrame([{"prediction": text, "value": float(value),
                            "holds": bool(value < -bound if bound < 0 else value > bound)}
                           for text, value, bound in predictions])
    return {"causal": causal, "patching": patching, "path_patching": paths,
            "knockout": knocked, "logit_attribution": dla, "composition": composition}


def plot_causal(tables: dict[str, pd.DataFrame], out) -> None:
    """Patching effect and DLA per head (layer × head), path patching by input, knockout."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for ax, (name, value, title) in zip(axes[:2], (
            ("patching", "effect", "Activation patching (denoising): effect"),
            ("logit_attribution", "value", "Direct logit attribution at copy steps")),
            strict=True):
        grid = tables[name].pivot(index="layer", columns="head", values=value).sort_index()
        sns.heatmap(grid, ax=ax, annot=True, fmt=".2f", cmap="Reds", cbar=False)
        ax.set_title(title, fontsize=10)
    paths = tables["path_patching"]
    axes[2].bar(paths["into"], paths["effect"], color="tab:purple")
    axes[2].set_title("Path noising: previous-token → induction heads", fontsize=10)
    axes[2].set_ylabel("effect (share destroyed)")
    knocked = tables["knockout"]
    axes[3].bar(knocked["blocked"], knocked["second_accuracy"], color="tab:blue")
    axes[3].axhline(float(knocked["chance"].iloc[0]), color="black", ls="--", label="chance")
    axes[3].set_ylim(0, 1)
    axes[3].legend(fontsize=8)
    axes[3].set_title("Layer-1 knockout: second-copy accuracy", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)

"""Raw attention vs rollout vs flow, layer by layer: Abnar & Zuidema's Tables 1–2 on MiniLM.

Abnar & Zuidema (2020; methods §8) correlate token importance read off the attention with two
references — input gradients and blank-out — per example (Spearman ρ), layer by layer. On their
6-layer agreement model, raw attention agrees best at the first layer and much less after it
(blank-out: 0.69 at L1, 0.10 at L2, −0.11 at L3), while rollout and flow rise with depth
(rollout 0.32 → 0.71, flow 0.32 → 0.70). Methods §14 says what transfers to all-MiniLM-L6-v2:
the method directly, the numbers only qualitatively — *raw correlation should drop after
layer 1, rollout/flow should rise with depth* — and it needs a scalar output.

Here the scalar is a similarity target: the cosine similarity between each sentence's
mean-pooled MiniLM embedding and that of one fixed reference sentence (``Config.reference``,
not in the corpus). The sentences are the first ``n_sentences`` of
``data/census_sentences.txt`` with at most ``max_tokens`` word pieces ([CLS] and [SEP]
included), so one attention flow per layer stays cheap (it is O(d²·n⁴)).

For every sentence :func:`attnprobe.attribution.comparison.compare` computes

- attention views, at every layer (``layer`` is the 0-based model index: A&Z's L1 is layer 0):
  ``raw`` (the [CLS] row of the head-averaged weights, as in the paper), ``rollout`` and
  ``flow`` (the [CLS] row; residual-augmented, head-averaged, as in the paper), and
  ``raw_max``, ``rollout_max``, ``flow_max`` (the max over query rows, as in A&Z's DistilBERT
  script — MiniLM pools the mean of all positions, not [CLS]);
- references (compared by magnitude, as A&Z take ``|Σ_d ∂y/∂e|``): input gradients —
  ``saliency`` (‖∂y/∂e_t‖₂) and ``input_x_gradient`` (Σ_d e_t·∂y/∂e_t) — and blank-out —
  ``occlusion`` (the token replaced by [UNK], which is A&Z's blank-out) and
  ``leave_one_out`` (the token deleted);

and the Spearman ρ over the sentence's tokens, [CLS] and [SEP] left out.

Tables:

- ``trend``: per (view, layer, reference) the mean ρ over sentences, its std, the share of
  sentences with p ≤ 0.05 (``frac_significant``) and ``n`` — A&Z's Tables 1–2 for MiniLM;
- ``verdict``: per (view, reference) the expectation of methods §14 and whether MiniLM shows
  it: for the raw views ``first_minus_later`` = ρ(layer 0) − mean ρ(layers 1..5) > 0 (and
  ``first_is_max``: layer 0 beats every later layer); for rollout and flow ``rise`` =
  ρ(last) − ρ(layer 0) > 0 and ``depth_trend`` (Spearman of mean ρ against the layer index)
  >= 0.5 (mostly rising, not up then down);
- ``checks``: flow equals rollout at the first layer (max |Δρ| over sentences and
  references), how far flow from [CLS] moves from its first-layer ρ at any deeper layer,
  the number of sentences and tokens;
- ``references``: how the references agree with each other (mean ρ), for scale;
- ``paper``: A&Z's Table 1 (blank-out) and Table 2 (input gradients) for comparison;
- ``agreement``: the per-sentence ρ behind ``trend``; ``sentences``: the sentences, their
  token counts and target values; ``skipped``: sentences a metric could not score (e.g. a
  constant importance vector), with the reason.

Reading flow from [CLS]: on MiniLM the unnormalised max-flow from [CLS] after layer ``l``
to every word ``v`` is ``A_0[CLS, v] + c_l``, with ``c_l`` the same for every word (checked
to 1e-4 on the first sentences): the residual-augmented [CLS] chain keeps most of its flow,
the flow that leaves it meets one shared bottleneck, and what is left to tell the words apart
is the last hop ``(layer 0, [CLS]) -> v``. Normalised, the values change with depth but the
ranking of the words does not, so ρ(flow from [CLS]) is the same at every layer (``checks``).
``flow_max`` reads every query row and is free of this.

Figure ``rollout_trend.png``: mean ρ by layer per view (± standard error over sentences), one
panel per reference, with A&Z's curves (dotted) on the panels of their references.

Budget: about 1.5 minutes on one CPU thread (50 sentences of ≤ 20 tokens).

Run: ``python analyses/rollout_trend.py [--smoke] [--out DIR]``; tables, the figure and
``provenance.json`` go to ``runs/rollout_trend/<UTC stamp>/``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from harness.runs import analysis_main

import attnprobe
from attnprobe.attribution.comparison import compare
from attnprobe.attribution.targets import parse_target
from attnprobe.core.lines import split_lines
from attnprobe.errors import InputError
from attnprobe.inputs.text import encode

DATA = Path(__file__).resolve().parent / "data"
# view label -> (attention view, query row)
VIEWS = {"raw": ("raw", "cls"), "raw_max": ("raw", "max"), "raw_mean": ("raw", "mean"),
         "rollout": ("rollout", "cls"), "rollout_max": ("rollout", "max"),
         "rollout_mean": ("rollout", "mean"), "flow": ("flow", "cls"),
         "flow_max": ("flow", "max")}
GRADIENTS = ("saliency", "input_x_gradient")
BLANK_OUT = ("occlusion", "leave_one_out")
METRIC = "spearman"
TREND_MIN = 0.5  # "rises with depth": Spearman of mean ρ against the layer index at least this
# Abnar & Zuidema 2020, Tables 1 (blank-out) and 2 (input gradients), L1..L6 (methods §8)
PAPER = {
    ("raw", "blank-out"): (0.69, 0.10, -0.11, -0.09, 0.20, 0.29),
    ("rollout", "blank-out"): (0.32, 0.38, 0.51, 0.62, 0.70, 0.71),
    ("flow", "blank-out"): (0.32, 0.44, 0.70, 0.70, 0.71, 0.70),
    ("raw", "input gradients"): (0.53, 0.16, -0.06, 0.00, 0.24, 0.46),
    ("rollout", "input gradients"): (0.22, 0.27, 0.39, 0.47, 0.53, 0.54),
    ("flow", "input gradients"): (0.22, 0.31, 0.54, 0.61, 0.60, 0.61),
}


@dataclass
class Config:
    model: str = "minilm"
    corpus: str = "census_sentences.txt"  # under analyses/data/
    n_sentences: int = 50
    max_tokens: int = 20  # word pieces per sentence, [CLS] and [SEP] included
    reference: str = "A musician is playing an old guitar on a busy street."
    views: tuple[str, ...] = ("raw", "raw_max", "rollout", "rollout_max", "flow", "flow_max")
    references: tuple[str, ...] = (*GRADIENTS, *BLANK_OUT)
    num_threads: int = 1  # 2 threads were slower on the shared 2-core machine

    @classmethod
    def smoke(cls) -> Config:
        return cls(n_sentences=3, max_tokens=12)


def family(reference: str) -> str:
    """A&Z's name for the kind of reference a method is."""
    return "input gradients" if reference in GRADIENTS else "blank-out"


def select(cfg: Config, tokenizer) -> list[tuple[str, int]]:
    """The first ``n_sentences`` sentences of the corpus with at most ``max_tokens`` tokens."""
    chosen = []
    for line in split_lines((DATA / cfg.corpus).read_text(encoding="utf-8")):
        text = line.strip()
        if not text:
            continue
        n = len(tokenizer(text)["input_ids"])
        if n <= cfg.max_tokens:
            chosen.append((text, n))
            if len(chosen) == cfg.n_sentences:
                break
    if len(chosen) < cfg.n_sentences:
        raise InputError(f"only {len(chosen)} sentences of {cfg.corpus} have at most "
                         f"{cfg.max_tokens} tokens; {cfg.n_sentences} wanted")
    return chosen


def by_query(views: tuple[str, ...]) -> dict[str, list[str]]:
    """Attention views to run per query row: ``{"cls": ["raw", "rollout"], "max": ["raw"]}``."""
    unknown = [v for v in views if v not in VIEWS]
    if unknown:
        raise InputError(f"unknown views {unknown}; choose from {sorted(VIEWS)}")
    out: dict[str, list[str]] = {}
    for label in views:
        view, query = VIEWS[label]
        out.setdefault(query, []).append(view)
    return out


def label_of(view: str, query: str) -> str:
    return next(k for k, v in VIEWS.items() if v == (view, query))


def explain(cfg: Config, model, tokenizer, text: str, example: int
            ) -> tuple[list[pd.DataFrame], str | None]:
    """Per-sentence agreement rows (every query row the views need), or the reason it failed."""
    target = f"similarity:{cfg.reference}"
    frames = []
    for k, (query, views) in enumerate(by_query(cfg.views).items()):
        try:
            result = compare(model, tokenizer, [text], target, methods=cfg.references,
                             views=views, query=query)
        except InputError as err:
            return [], str(err)
        table = result.table[result.table.metric == METRIC].copy()
        if k:  # the method-vs-method rows do not depend on the query: keep them once
            table = table[table.source_kind == "attention"]
        table["example_id"] = example
        attention = table.source_kind == "attention"
        table.loc[attention, "view"] = [label_of(v, query) for v in table.view[attention]]
        table.loc[attention, "source"] = [f"{v}@L{layer}" for v, layer in
                                          zip(table.view[attention], table.layer[attention],
                                              strict=True)]
        frames.append(table)
    return frames, None


def summarise(agreement: pd.DataFrame) -> pd.DataFrame:
    """Mean, std, share with p ≤ 0.05 and n per (view, layer, reference)."""
    rows = agreement[agreement.source_kind == "attention"]
    grouped = rows.groupby(["view", "layer", "method"], sort=False)
    out = grouped.value.agg(["mean", "std", "count"]).reset_index()
    out["frac_significant"] = grouped.p_value.apply(lambda p: float((p <= 0.05).mean())).values
    out = out.rename(columns={"method": "reference", "mean": "mean_rho", "count": "n"})
    out.insert(3, "family", out.reference.map(family))
    references = {name: i for i, name in enumerate(dict.fromkeys(rows.method))}
    views = {label: i for i, label in enumerate(VIEWS)}
    out = out.assign(_r=out.reference.map(references), _v=out.view.map(views))
    out = out.sort_values(["_r", "_v", "layer"], kind="stable")
    return out[["view", "layer", "reference", "family", "mean_rho", "std",
                "frac_significant", "n"]].reset_index(drop=True)


def _trend(layers: pd.Series, values: pd.Series) -> float:
    from scipy.stats import spearmanr

    if len(values) < 2 or values.nunique() < 2:
        return math.nan
    return float(spearmanr(layers, values).statistic)


def verdict(trend: pd.DataFrame) -> pd.DataFrame:
    """Methods §14's expectation per (view, reference), and whether the means show it."""
    rows = []
    for (view, reference), sub in trend.groupby(["view", "reference"], sort=False):
        sub = sub.sort_values("layer")
        rho = sub.mean_rho.to_numpy()
        first, last = float(rho[0]), float(rho[-1])
        later = rho[1:]
        row = {"view": view, "reference": reference, "family": family(reference),
               "rho_first": first, "rho_last": last,
               "rho_later_mean": float(later.mean()) if len(later) else math.nan,
               "first_minus_later": first - float(later.mean()) if len(later) else math.nan,
               "first_is_max": bool(len(later) and first > later.max()),
               "rise": last - first, "depth_trend": _trend(sub.layer, sub.mean_rho)}
        if view.startswith("raw"):
            row["expected"] = "drops after the first layer"
            row["shown"] = bool(row["first_minus_later"] > 0)
        else:
            row["expected"] = "rises with depth"
            row["shown"] = bool(row["rise"] > 0 and row["depth_trend"] >= TREND_MIN)
        rows.append(row)
    return pd.DataFrame(rows)


def paper_table() -> pd.DataFrame:
    return pd.DataFrame([{"view": view, "layer": layer, "family": reference, "mean_rho": rho}
                         for (view, reference), values in PAPER.items()
                         for layer, rho in enumerate(values)])


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Explain every sentence and tabulate ρ by layer; tidy tables (nothing is printed)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.num_threads)
    try:
        model, tokenizer = attnprobe.load_model(cfg.model)
        chosen = select(cfg, tokenizer)
        target = parse_target(f"similarity:{cfg.reference}", model, tokenizer)
        frames, skipped, sentences = [], [], []
        for i, (text, n) in enumerate(chosen):
            batch = encode(model, tokenizer, [text])
            with torch.no_grad():
                value = float(target(model(**batch), batch)[0])
            sentences.append({"example_id": i, "text": text, "n_tokens": n,
                              "similarity": value})
            found, reason = explain(cfg, model, tokenizer, text, i)
            if reason is not None:
                skipped.append({"example_id": i, "text": text, "reason": reason})
            frames += found
    finally:
        torch.set_num_threads(threads)
    agreement = pd.concat(frames, ignore_index=True)
    trend = summarise(agreement)
    attention = agreement[agreement.source_kind == "attention"]
    checks = [{"check": "sentences explained", "value": float(attention.example_id.nunique())},
              {"check": "sentences skipped", "value": float(len(skipped))},
              {"check": "mean tokens per sentence ([CLS], [SEP] included)",
               "value": float(pd.DataFrame(sentences).n_tokens.mean())}]
    if {"rollout", "flow"} <= set(cfg.views):
        first = attention[attention.layer == 0].pivot_table(
            index=["example_id", "method"], columns="view", values="value")
        checks.append({"check": "max |rho(flow) - rho(rollout)| at layer 0 (identical)",
                       "value": float((first["flow"] - first["rollout"]).abs().max())})
    if "flow" in cfg.views:
        flow = attention[attention.view == "flow"].pivot_table(
            index=["example_id", "method"], columns="layer", values="value")
        checks.append({"check": "max |rho(flow@L) - rho(flow@L0)| over deeper layers",
                       "value": float(flow.sub(flow[0], axis=0).abs().to_numpy().max())})
    pairs = agreement[agreement.source_kind == "attribution"]
    references = (pairs.groupby(["source", "method"], sort=False).value
                  .agg(["mean", "std", "count"]).reset_index()
                  .rename(columns={"mean": "mean_rho", "count": "n"}))
    return {"trend": trend, "verdict": verdict(trend), "checks": pd.DataFrame(checks),
            "references": references, "paper": paper_table(), "agreement": agreement,
            "sentences": pd.DataFrame(sentences),
            "skipped": pd.DataFrame(skipped, columns=["example_id", "text", "reason"])}


def plot(tables: dict[str, pd.DataFrame], path: Path) -> Path:
    """Mean ρ by layer per view (± standard error), one panel per reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trend, paper = tables["trend"], tables["paper"]
    references = list(dict.fromkeys(trend.reference))
    fig, axes = plt.subplots(1, len(references), figsize=(4.2 * len(references), 4.4),
                             sharey=True, squeeze=False)
    colours = {"raw": "tab:blue", "raw_max": "tab:cyan", "raw_mean": "tab:purple",
               "rollout": "tab:orange", "rollout_max": "tab:brown", "rollout_mean": "tab:pink",
               "flow": "tab:green", "flow_max": "tab:olive"}
    for ax, reference in zip(axes[0], references, strict=True):
        sub = trend[trend.reference == reference]
        for view, rows in sub.groupby("view", sort=False):
            rows = rows.sort_values("layer")
            sem = rows["std"] / rows["n"].clip(lower=1) ** 0.5
            ax.errorbar(rows.layer, rows.mean_rho, yerr=sem, marker="o", capsize=2,
                        label=view, color=colours.get(view))
        for view, rows in paper[paper.family == family(reference)].groupby("view", sort=False):
            ax.plot(rows.layer, rows.mean_rho, linestyle=":", color=colours.get(view),
                    alpha=0.6, label=f"A&Z {view}")
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set_title(f"vs {reference} ({family(reference)})", fontsize=9)
        ax.set_xlabel("layer (0 = A&Z's L1)")
        ax.set_xticks(sorted(sub.layer.unique()))
    axes[0][0].set_ylabel("mean Spearman ρ over sentences (± s.e.)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8,
               frameon=False)
    fig.suptitle("MiniLM, cosine similarity to a reference sentence: attention vs references "
                 "(dotted: Abnar & Zuidema's model)", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    out = path / "rollout_trend.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    analysis_main("rollout_trend", __doc__, Config, run, plot, argv,
                  show=["trend", "verdict", "checks", "references"])


if __name__ == "__main__":
    main()

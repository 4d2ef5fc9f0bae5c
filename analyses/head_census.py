"""The head census of MiniLM: what every attention head does, over 1,000 parsed sentences.

The sentences of ``data/census_sentences.txt`` are parsed with spaCy
(``attnprobe.heads.parse``: ClearNLP labels, ``dobj`` is UD ``obj``) and run through
:func:`attnprobe.heads.census` with their trees, which scores every head of the default
model (``all-MiniLM-L6-v2``, 6 layers x 12 heads) on:

- streaming statistics: entropy, max weight, mass at each relative offset, mass on special
  and punctuation tokens, mass on each head's sink keys and every pattern score judged on the
  mass left after them (``*_nosink``), token-match scores, and the repeated-random-token probe
  (``rep_*``: previous, duplicate and induction heads; ``[CLS] x x [SEP]``, the tokenizer's
  own template);
- syntax (Clark et al. 2019 §4): for each dependency relation, how often a head's most
  attended word (``dep->head`` or ``head->dep``, special tokens dropped, token attention
  averaged into words) is the gold head, against the best fixed-offset baseline;
- Jensen–Shannon distance between heads (Clark §6), clustered (average linkage) and embedded
  in 2-D (MDS).

Tables (``runs/head_census/<stamp>/``): ``labels`` (label, family, evidence, every score per
head), ``label_counts`` (heads per label, grouped by family), ``family_counts``, ``probe``
(for each ``rep_*`` score: the heads above 0.4 and the top head), ``syntax`` (best head per
relation, ``min_count``), ``syntax_top`` (the ``top_k`` heads per relation), ``syntax_key``
(the det and dobj/obj rows), ``layer_profile``, ``clusters`` (``clusters(n_clusters)`` with
labels), ``offsets``, ``distances`` and ``summary``. Figures: label map and key-score maps
(layer x head), the layer profile, syntax accuracy vs baseline per relation, and the MDS
scatter of heads; their legends list the labels grouped by family.

Run: ``python analyses/head_census.py [--smoke] [--out DIR]`` (about 1 minute on 2 cores).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from harness.runs import analysis_main

import attnprobe
from attnprobe.core.lines import split_lines
from attnprobe.heads import RULES, census, layer_profile, parse
from attnprobe.heads.label_rules import FALLBACK_COLOUR
from attnprobe.heads.labels import label_counts

DATA = Path(__file__).resolve().parent / "data"
KEY_RELATIONS = ("det", "dobj", "obj")
KEY_SCORES = ("entropy_norm", "prev", "prev_nosink", "next_nosink", "sink", "syntax_margin")
REP_SCORES = ("rep_prev", "rep_duplicate", "rep_induction", "rep_duplicate_ahead",
              "rep_induction_ahead")
REP_THRESHOLD = 0.4


@dataclass
class Config:
    model: str = "minilm"
    corpus: str = "census_sentences.txt"  # under analyses/data/
    n_sentences: int = 1000
    batch_size: int = 32
    min_count: int = 10  # relations with fewer words are left out of the syntax table
    top_k: int = 3  # heads per relation in syntax_top
    n_clusters: int = 8
    seed: int = 0
    probe_length: int | None = None  # tokens per copy of the probe (None: 32, or what fits)

    @classmethod
    def smoke(cls) -> Config:
        return cls(n_sentences=40)


def _sentences(cfg: Config) -> list[str]:
    lines = [line.strip() for line in split_lines((DATA / cfg.corpus).read_text(encoding="utf-8"))]
    texts = [line for line in lines if line]
    if len(texts) < cfg.n_sentences:
        raise ValueError(f"{cfg.corpus} has {len(texts)} sentences, fewer than {cfg.n_sentences}")
    return texts[:cfg.n_sentences]


def _top_heads(head_table: pd.DataFrame, syntax: pd.DataFrame, k: int) -> pd.DataFrame:
    """The ``k`` most accurate (head, direction) pairs of every relation in ``syntax``."""
    table = head_table[head_table["relation"].isin(syntax["relation"])]
    table = table.sort_values(["relation", "accuracy"], ascending=[True, False], kind="stable")
    top = table.groupby("relation", sort=False).head(k).copy()
    top["rank"] = top.groupby("relation", sort=False).cumcount() + 1
    order = {r: i for i, r in enumerate(syntax["relation"])}
    top["order"] = top["relation"].map(order)
    top = top.sort_values(["order", "rank"]).drop(columns="order")
    return top.reset_index(drop=True)


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Parse, run the census and build every table (nothing is printed)."""
    torch.manual_seed(cfg.seed)
    model, tokenizer = attnprobe.load_model(cfg.model)
    texts = _sentences(cfg)
    start = time.perf_counter()
    trees = parse(texts)
    parse_s = time.perf_counter() - start
    start = time.perf_counter()
    result = census(model, tokenizer, trees=trees, batch_size=cfg.batch_size, seed=cfg.seed,
                    probe_length=cfg.probe_length)
    census_s = time.perf_counter() - start
    labels = result.classify()
    counts = label_counts(labels)[["label", "heads", "share", "layers", "family", "family_heads",
                                   "head_ids"]]  # the columns of earlier runs first
    families = counts.groupby("family", sort=False).agg(
        heads=("heads", "sum"), labels=("label", ", ".join)).reset_index()
    families["share"] = families["heads"] / len(labels)
    probe = pd.DataFrame([{
        "score": score, "threshold": REP_THRESHOLD,
        "heads_above": ", ".join(labels.loc[labels[score] > REP_THRESHOLD, "head_id"]),
        "top_head": labels.loc[labels[score].idxmax(), "head_id"],
        "top_value": float(labels[score].max())} for score in REP_SCORES if score in labels])

    syntax = result.syntax(cfg.min_count)
    top = _top_heads(result.sums.syntax.head_table(cfg.min_count), syntax, cfg.top_k)
    key = syntax[syntax["relation"].isin(KEY_RELATIONS)].reset_index(drop=True)
    clusters = result.clusters(n_clusters=cfg.n_clusters).merge(
        labels[["layer", "head", "label"]], on=["layer", "head"], how="left")
    summary = pd.DataFrame([
        {"item": "sentences", "value": result.n_sentences},
        {"item": "words scored (non-root)", "value": int(syntax.loc[
            syntax["relation"] == "all", "count"].iloc[0]) if (syntax["relation"] == "all").any()
            else 0},
        {"item": "heads", "value": len(labels)},
        {"item": "parse seconds", "value": round(parse_s, 2)},
        {"item": "census + probe seconds", "value": round(census_s, 2)},
        {"item": "skipped (too long)", "value": len(result.skipped)},
        {"item": "probe tokens per copy", "value": result.probe_length},
    ])
    return {"labels": labels, "label_counts": counts, "family_counts": families,
            "probe": probe, "syntax": syntax,
            "syntax_top": top, "syntax_key": key, "layer_profile": layer_profile(labels),
            "clusters": clusters, "offsets": result.offsets(), "distances": result.distances(),
            "summary": summary}


# ----------------------------------------------------------------------------------- plots
def _label_colours() -> dict[str, str]:
    """The label colours of the rule registry, so plots and the HTML report agree."""
    return {label: RULES.colour(label) or FALLBACK_COLOUR for label in RULES.precedence()}


def _by_family() -> list[str]:
    """Every label, grouped by family (as the report's legends)."""
    return [label for family in RULES.families() for label in RULES.labels_of(family)]


def _grid(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    return frame.pivot(index="layer", columns="head", values=column).sort_index()


def plot(tables: dict[str, pd.DataFrame], path: Path) -> list[Path]:
    """Label map, key-score maps, layer profile, syntax vs baseline, MDS scatter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    colours = _label_colours()
    labels = tables["labels"]
    written = []

    # 1. label of every head (categorical)
    present = [lb for lb in _by_family() if lb in set(labels["label"])]
    code = {lb: i for i, lb in enumerate(present)}
    grid = _grid(labels.assign(code=labels["label"].map(code)), "code")
    fig, ax = plt.subplots(figsize=(1.0 + 0.62 * grid.shape[1], 1.2 + 0.55 * grid.shape[0]))
    ax.imshow(grid.to_numpy(), cmap=ListedColormap([colours[lb] for lb in present]),
              vmin=-0.5, vmax=len(present) - 0.5, aspect="auto")
    short = _grid(labels, "label")
    for (i, j), name in pd.DataFrame(short.to_numpy()).stack().items():
        ax.text(j, i, str(name)[:4], ha="center", va="center", fontsize=7)
    ax.set_xticks(range(grid.shape[1]), grid.columns)
    ax.set_yticks(range(grid.shape[0]), grid.index)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.legend(handles=[Patch(color=colours[lb], label=lb) for lb in present],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title("Head labels (classify)")
    fig.tight_layout()
    written.append(path / "labels.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    # 2. key scores per head
    scores = [s for s in KEY_SCORES if s in labels.columns]
    fig, axes = plt.subplots(2, (len(scores) + 1) // 2, figsize=(5.2 * ((len(scores) + 1) // 2),
                                                                 7.5), squeeze=False)
    for ax, score in zip(axes.ravel(), scores, strict=False):
        values = _grid(labels.assign(**{score: pd.to_numeric(labels[score], errors="coerce")}),
                       score)
        centred = score == "syntax_margin"
        sns.heatmap(values, ax=ax, annot=True, fmt=".2f", annot_kws={"fontsize": 6},
                    cmap="RdBu_r" if centred else "viridis", center=0 if centred else None,
                    vmin=None if centred else 0, vmax=None if centred else 1, cbar=True)
        ax.set_title(score)
    for ax in axes.ravel()[len(scores):]:
        ax.axis("off")
    fig.suptitle("Key scores per head (layer x head)")
    fig.tight_layout()
    written.append(path / "scores.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    # 3. layer profile: label shares (stacked) with mean distance and entropy
    profile = tables["layer_profile"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bottom = pd.Series(0.0, index=profile.index)
    for label in _by_family():
        share = profile[f"share_{label}"]
        if share.sum() > 0:
            ax.bar(profile["layer"], share, bottom=bottom, color=colours[label], label=label)
            bottom += share
    ax.set_xlabel("layer")
    ax.set_ylabel("share of the layer's heads")
    ax.set_ylim(0, 1)
    twin = ax.twinx()
    twin.plot(profile["layer"], profile["distance"], "k-o", label="mean distance (tokens)")
    twin.plot(profile["layer"], profile["entropy"], "k--s", label="mean entropy (nats)")
    twin.set_ylabel("distance (tokens) / entropy (nats)")
    twin.set_ylim(0, None)
    handles, names = ax.get_legend_handles_labels()
    more, more_names = twin.get_legend_handles_labels()
    ax.legend(handles + more, names + more_names, loc="upper left", bbox_to_anchor=(1.12, 1),
              fontsize=8)
    ax.set_title("Layer profile")
    fig.tight_layout()
    written.append(path / "layer_profile.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    # 4. syntax: best head vs fixed-offset baseline per relation
    syntax = tables["syntax"]
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * len(syntax)), 4.5))
    x = range(len(syntax))
    ax.bar([i - 0.2 for i in x], syntax["accuracy"], 0.4, label="best head", color="tab:blue")
    ax.bar([i + 0.2 for i in x], syntax["baseline"], 0.4, label="best fixed offset",
           color="tab:gray")
    for i, row in enumerate(syntax.itertuples()):
        ax.text(i - 0.2, row.accuracy + 0.01, row.head_id, ha="center", va="bottom",
                fontsize=6, rotation=90)
    ax.set_xticks(list(x), [f"{r} ({c})" for r, c in zip(syntax["relation"], syntax["count"],
                                                        strict=True)],
                  rotation=60, ha="right", fontsize=7)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=8)
    ax.set_title("Dependency relations: best head vs best offset baseline (count of words)")
    fig.tight_layout()
    written.append(path / "syntax.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    # 5. MDS of head distances, coloured by label
    clusters = tables["clusters"]
    fig, ax = plt.subplots(figsize=(7.5, 6))
    for label in _by_family():
        sub = clusters[clusters["label"] == label]
        if len(sub):
            ax.scatter(sub["x"], sub["y"], color=colours[label], label=label, s=40,
                       edgecolors="black", linewidths=0.4)
    for row in clusters.itertuples():
        ax.annotate(f"{attnprobe.head_id(row.layer, row.head)} c{row.cluster}", (row.x, row.y),
                    fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.legend(fontsize=8, loc="best")
    ax.set_title("Heads by Jensen–Shannon distance (MDS; cN = cluster)")
    fig.tight_layout()
    written.append(path / "mds.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> None:
    analysis_main("head_census", __doc__, Config, run, plot, argv,
                  show=["summary", "family_counts", "label_counts", "probe", "syntax_key"])


if __name__ == "__main__":
    main()

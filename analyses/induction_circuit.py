"""The induction circuit of ``ref:induction``, recovered by every analysis of attnprobe.

``ref:induction`` is a 2-layer, 4-head attention-only RoPE decoder trained to continue a
repeated segment of random symbols (Olsson et al. 2022; Elhage et al. 2021). Its circuit is
known: a previous-token head in layer 0 writes "the token before me" into each position, and
induction heads in layer 1 attend from the current token to the token after its earlier copy
and copy it. On held-out sequences (a seed the training run never used) this script:

1. reports the model: next-token accuracy and loss on the second copy, next to the first
   copy's matching positions (the same tokens before any copy exists), and the training log;
2. runs the head census (``ap.heads.census``): labels with their evidence, the corpus
   ``induction`` score (mass on the token after an earlier copy of the query's token) and the
   repeated-token probe's ``rep_induction`` / ``rep_prev``;
3. ablates (``ap.perturb.perturbed(model, "zero", scope)``) each of the 8 heads alone, the
   census's induction heads together, its previous-token heads together and every other head
   together, and measures the second-copy accuracy and loss after each;
4. explains the model's own next token at one random second-copy position per sequence (the
   prefix ending there is fed) with Integrated Gradients, attention × gradient (Chefer et al.)
   and the raw last-row attention of the census's induction heads, and counts how often each
   one's top token is the token after the earlier copy (``source + 1``), beside a random
   position (chance). Candidates are the prefix's symbols (``[BOS]`` is not one); ``context``
   also leaves out the query token itself (attention × gradient's rollout starts from the
   identity, so the query always has at least 1 there).

Tables (``runs/induction_circuit/<stamp>/``): ``model``, ``training``, ``labels`` (the full
census table), ``census`` (the circuit's columns), ``ablation``, ``attribution_steps`` (one row
per step and method), ``attribution`` (top-1 shares with chance), ``checks`` and ``summary``.
Figures: ``ablation.png`` (layer x head accuracy drop and the head sets), ``census.png``,
``attribution.png``, ``pattern.png`` (the heads' attention on one held-out sequence).

Run: ``python analyses/induction_circuit.py [--smoke] [--out DIR]`` (about a minute on 2
cores; ``--smoke``: seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from harness.induction_causal import causal_section, plot_causal
from harness.runs import analysis_main

import attnprobe as ap
from attnprobe.tasks.induction import (
    HELD_OUT_SEED,
    copy_scores,
    copy_steps,
    held_out,
    prefix_text,
    segment_texts,
)

CENSUS_COLUMNS = ("layer", "head", "label", "evidence", "also", "prev", "induction",
                  "duplicate", "rep_prev", "rep_induction", "rep_duplicate", "first",
                  "entropy_norm")
RELATIONS = ("source+1", "source", "query", "other")


@dataclass
class Config:
    model: str = "ref:induction"
    n_sequences: int = 512  # held-out sequences: model report, census and ablations
    n_explained: int = 300  # copy steps explained (one per sequence, the first sequences)
    ig_steps: int = 50
    batch_size: int = 64
    n_causal: int = 64  # sequences (and their corruptions) of the causal section
    seed: int = HELD_OUT_SEED  # held-out data; training uses recipe.seed + 1

    @classmethod
    def smoke(cls) -> Config:
        return cls(n_sequences=16, n_explained=6, ig_steps=16, n_causal=16)


def _heads(labels: pd.DataFrame, label: str) -> list[tuple[int, int]]:
    rows = labels[labels["label"] == label]
    return [(int(r.layer), int(r.head)) for r in rows.itertuples()]


def _scope(heads: list[tuple[int, int]]) -> str:
    return "heads:" + ",".join(f"{layer}.{head}" for layer, head in heads)


def _ablation(model, segments, labels: pd.DataFrame, batch_size: int) -> pd.DataFrame:
    """Second- and first-copy scores with nothing, each head, and each head set zeroed."""
    label_of = {(int(r.layer), int(r.head)): r.label for r in labels.itertuples()}
    induction, previous = _heads(labels, "induction"), _heads(labels, "previous")
    others = [h for h in label_of if h not in induction and h not in previous]
    runs = [("none", None, "none", [])]
    runs += [(ap.head_id(*h), _scope([h]), "head", [h]) for h in label_of]
    for name, heads in (("induction heads (census)", induction),
                        ("previous-token heads (census)", previous),
                        ("every other head", others)):
        if heads:
            runs.append((name, _scope(heads), "set", heads))
    rows = []
    for name, scope, kind, heads in runs:
        if scope is None:
            scores = copy_scores(model, segments, batch_size=batch_size)
        else:
            with ap.perturb.perturbed(model, "zero", scope):
                scores = copy_scores(model, segments, batch_size=batch_size)
        by_half = scores.set_index("half")
        one = heads[0] if kind == "head" else (None, None)
        rows.append({"ablated": name, "scope": scope or "", "kind": kind, "layer": one[0],
                     "head": one[1], "n_heads": len(heads),
                     "labels": ",".join(sorted({label_of[h] for h in heads})),
                     "second_accuracy": by_half.at["second", "accuracy"],
                     "second_loss": by_half.at["second", "loss"],
                     "first_accuracy": by_half.at["first", "accuracy"],
                     "first_loss": by_half.at["first", "loss"]})
    table = pd.DataFrame(rows)
    table["accuracy_drop"] = table.at[0, "second_accuracy"] - table["second_accuracy"]
    table["loss_change"] = table["second_loss"] - table.at[0, "second_loss"]
    return table


def _relation(top: int, step) -> str:
    return {step.target: "source+1", step.source: "source", step.position: "query"}.get(
        top, "other")


def _explain(model, tok, segments, steps, scope: str, cfg: Config) -> pd.DataFrame:
    """One row per (step, method): the top-1 position over the prefix's symbols and over its
    context (query left out), and what that position is."""
    texts = [prefix_text(segments, tok, s) for s in steps]
    with torch.no_grad():  # the model's own next token at every step (one causal forward)
        predicted = model(segments.input_ids).argmax(-1)  # [batch, seq]
    ig = ap.attribution.attribute(model, tok, texts, "next-token", ["integrated_gradients"],
                                  n_steps=cfg.ig_steps)
    generator = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for k, (step, text) in enumerate(zip(steps, texts, strict=True)):
        target = ap.attribution.parse_target("next-token", model, tok)
        views = ap.attribution.attention_importance(model, tok, text, target,
                                                    views=["attn_x_grad", "raw"], scope=scope,
                                                    query="last")
        n = step.position  # symbols 1..position; [BOS] (position 0) is no candidate
        # chance, drawn: distinct random scores make the top-1 of any candidate set uniform
        random = torch.rand(step.position + 1, generator=generator, dtype=torch.float64)
        explained = [(ig[k].method, ig[k].scores, ig[k].target, ig[k].delta),
                     *((v.method, v.scores, v.target, None) for v in views),
                     ("random", random, "", None)]
        token = int(predicted[step.example, step.position])
        for method, scores, spec, delta in explained:
            scores = torch.as_tensor(scores, dtype=torch.float64)
            candidates = scores[1:]
            top = 1 + int(candidates.argmax())
            top_context = 1 + int(candidates[:-1].argmax()) if n > 1 else top
            rows.append({**vars(step), "target": step.target, "candidates": n,
                         "predicted": token,
                         "correct": token == int(segments.input_ids[step.example,
                                                                   step.position + 1]),
                         "method": method, "explains": spec, "delta": delta,
                         "top1": top, "top1_relation": _relation(top, step),
                         "top1_context": top_context,
                         "top1_context_relation": _relation(top_context, step)})
    return pd.DataFrame(rows)


def _shares(steps: pd.DataFrame) -> pd.DataFrame:
    """Per method and candidate set: share of steps whose top-1 is each relation, and chance
    (a uniformly random candidate: the mean of 1 / candidates)."""
    rows = []
    for method, group in steps.groupby("method", sort=False):
        for among, column, size in (("symbols", "top1_relation", group["candidates"]),
                                    ("context", "top1_context_relation",
                                     group["candidates"] - 1)):
            counts = group[column].value_counts()
            row = {"method": method, "among": among, "steps": len(group)}
            row.update({f"share_{r}": counts.get(r, 0) / len(group) for r in RELATIONS})
            row["chance"] = float((1 / size.clip(lower=1)).mean())
            row["share_over_chance"] = row["share_source+1"] / row["chance"]
            rows.append(row)
    return pd.DataFrame(rows)


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Report the model, run the census, the ablations and the attributions."""
    model, tok = ap.load_model(cfg.model)
    segments = held_out(cfg.n_sequences, cfg.seed, tokenizer=tok)
    texts = segment_texts(segments, tok)
    scores = copy_scores(model, segments, batch_size=cfg.batch_size)
    log = getattr(model, "training_log", {})
    training = pd.DataFrame(log.get("loss", []), columns=["step", "train_loss"])

    result = ap.heads.census(model, tok, texts, batch_size=cfg.batch_size, seed=cfg.seed,
                             similarity=False)
    labels = result.classify()
    circuit = labels[[c for c in CENSUS_COLUMNS if c in labels.columns]].copy()
    circuit.insert(2, "head_id", [ap.head_id(r.layer, r.head) for r in circuit.itertuples()])

    ablation = _ablation(model, segments, labels, cfg.batch_size)

    induction = _heads(labels, "induction")
    last_layer = int(labels["layer"].max())
    scope = _scope(induction) if induction else f"layer:{last_layer}"
    steps = copy_steps(segments, per_sequence=1, seed=cfg.seed)[:cfg.n_explained]
    explained = _explain(model, tok, segments, steps, scope, cfg)
    shares = _shares(explained)

    ig = explained[explained["method"] == "integrated_gradients"]
    attributed = explained[explained["explains"].str.startswith("next-token:")]
    mismatched = int((attributed["explains"] != "next-token:"
                      + attributed["predicted"].astype(str)).sum())
    checks = pd.DataFrame([
        {"check": "held-out sequences", "value": cfg.n_sequences},
        {"check": "steps explained", "value": len(steps)},
        {"check": "explained token != the model's own prediction (rows)", "value": mismatched},
        {"check": "max Integrated Gradients delta", "value": float(ig["delta"].abs().max())},
        {"check": "steps whose prediction is correct (share)",
         "value": float(ig["correct"].mean())},
    ])
    by_half = scores.set_index("half")
    indexed = shares.set_index(["method", "among"])

    def top1(method: str, among: str) -> str:
        if (method, among) not in indexed.index:
            return "n/a"
        row = indexed.loc[(method, among)]
        return f"{row['share_source+1']:.3f} (chance {row['chance']:.3f})"

    summary = pd.DataFrame([
        {"item": "second-copy accuracy / loss",
         "value": f"{by_half.at['second', 'accuracy']:.3f} / {by_half.at['second', 'loss']:.3f}"},
        {"item": "first-copy accuracy / loss",
         "value": f"{by_half.at['first', 'accuracy']:.3f} / {by_half.at['first', 'loss']:.3f}"},
        {"item": "training steps / seconds / last train loss",
         "value": f"{log.get('steps')} / {float(log.get('seconds', float('nan'))):.0f} / "
                  f"{training['train_loss'].iloc[-1] if len(training) else float('nan'):.3f}"},
        {"item": "previous-token heads (census)",
         "value": " ".join(ap.head_id(*h) for h in _heads(labels, "previous"))},
        {"item": "induction heads (census)", "value": " ".join(ap.head_id(*h) for h in induction)},
        {"item": "IG top-1 on source+1 (symbols)",
         "value": top1("integrated_gradients", "symbols")},
        {"item": "attn x grad top-1 on source+1 (context)",
         "value": top1("attn_x_grad", "context")},
    ])
    example = ap.extract(model, tok, texts[:1])[0].to_frame()  # pattern.png
    causal = causal_section(model, tok, held_out(cfg.n_causal, cfg.seed, tokenizer=tok),
                            labels, cfg.seed)
    held = causal["causal"]
    summary.loc[len(summary)] = {"item": "causal predictions that hold",
                                 "value": f"{int(held['holds'].sum())} of {len(held)}"}
    return {"model": scores, "training": training, "labels": labels, "census": circuit,
            "ablation": ablation, "attribution_steps": explained, "attribution": shares,
            "checks": checks, "summary": summary, "example_pattern": example, **causal}


# ----------------------------------------------------------------------------------- plots
def plot(tables: dict[str, pd.DataFrame], path: Path) -> list[Path]:
    """Ablation heatmap and sets, census scores, attribution shares, one attention example."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    written = []
    ablation, census = tables["ablation"], tables["census"]
    heads = ablation[ablation["kind"] == "head"].astype({"layer": int, "head": int})
    grid = heads.pivot(index="layer", columns="head", values="accuracy_drop").sort_index()
    names = census.set_index(["layer", "head"])["label"]
    notes = grid.copy().astype(object)
    for layer in grid.index:
        for head in grid.columns:
            notes.loc[layer, head] = f"{grid.loc[layer, head]:+.3f}\n{names[(layer, head)][:9]}"
    sets = ablation[ablation["kind"] != "head"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8),
                                      gridspec_kw={"width_ratios": [1.2, 1]})
    sns.heatmap(grid.astype(float), ax=left, annot=notes.to_numpy(), fmt="", vmin=0, vmax=1,
                cmap="Reds", cbar_kws={"label": "second-copy accuracy drop"})
    left.set_title("One head zeroed: drop in second-copy accuracy")
    right.barh(sets["ablated"], sets["second_accuracy"], color="tab:blue",
               label="second copy")
    right.barh(sets["ablated"], sets["first_accuracy"], color="tab:gray", height=0.4,
               label="first copy (chance)")
    right.set_xlim(0, 1)
    right.set_xlabel("next-token accuracy")
    right.invert_yaxis()
    right.legend(fontsize=8, loc="lower right")
    right.set_title("Head sets zeroed together")
    fig.tight_layout()
    written.append(path / "ablation.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    scores = ("prev", "induction", "rep_prev", "rep_induction")
    fig, axes = plt.subplots(1, len(scores), figsize=(4 * len(scores), 3))
    for ax, score in zip(axes, scores, strict=True):
        values = census.pivot(index="layer", columns="head", values=score).sort_index()
        sns.heatmap(values, ax=ax, annot=True, fmt=".2f", vmin=0, vmax=1, cmap="viridis",
                    cbar=False)
        ax.set_title(score)
    fig.suptitle("Census scores on held-out sequences (layer x head)")
    fig.tight_layout()
    written.append(path / "census.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    shares = tables["attribution"]
    rows = [f"{r.method} ({r.among})" for r in shares.itertuples()]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    left = pd.Series(0.0, index=shares.index)
    colours = {"source+1": "tab:green", "source": "tab:olive", "query": "tab:blue",
               "other": "lightgray"}
    for relation, colour in colours.items():
        share = shares[f"share_{relation}"]
        ax.barh(rows, share, left=left, color=colour, label=f"top-1 = {relation}")
        left += share
    ax.scatter(shares["chance"], rows, marker="|", s=200, color="black",
               label="chance for source+1", zorder=3)
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of second-copy steps")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("Where each method's top-1 token lies (source+1 = the token copied)")
    fig.tight_layout()
    written.append(path / "attribution.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    written.append(_plot_pattern(tables, path / "pattern.png"))
    if "patching" in tables:
        written.append(path / "causal.png")
        plot_causal(tables, written[-1])
    return written


def _plot_pattern(tables: dict[str, pd.DataFrame], out: Path) -> Path:
    """Every head's attention on the first held-out sequence."""
    import matplotlib.pyplot as plt

    frame = tables["example_pattern"]
    labels = tables["census"].set_index(["layer", "head"])["label"]
    layers, heads = sorted(frame["layer"].unique()), sorted(frame["head"].unique())
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(3 * len(heads), 3 * len(layers)),
                             squeeze=False)
    for li, layer in enumerate(layers):
        for hi, head in enumerate(heads):
            cell = frame[(frame["layer"] == layer) & (frame["head"] == head)]
            grid = cell.pivot(index="query_pos", columns="key_pos", values="weight").sort_index()
            ax = axes[li, hi]
            ax.imshow(grid.to_numpy(), cmap="Blues", vmin=0, vmax=1)
            ax.set_title(f"{ap.head_id(layer, head)} {labels.get((layer, head), '')}",
                         fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle("Attention on one held-out sequence (rows: query, columns: key)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    analysis_main("induction_circuit", __doc__, Config, run, plot, argv,
                  show=["summary", "model", "census", "ablation", "attribution", "checks",
                        "causal"])


if __name__ == "__main__":
    main()

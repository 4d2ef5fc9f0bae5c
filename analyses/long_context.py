"""Retrieval heads of ``ref:induction`` on a needle task, by context length and needle depth.

``ref:induction`` (2 layers x 4 heads, attention only, RoPE) was trained on 48-token sequences
to continue a repeated segment. Here a random needle of ``needle_len`` symbols sits at a
relative ``depth`` in a haystack of random symbols, and the context ends with the needle's
first ``prefix_len`` tokens (``attnprobe.tasks.needle``; by default the needle's symbols are
distinct and absent from the haystack, so every copy has exactly one source). The script:

1. finds the **retrieval heads** (Wu et al. 2024: share of copy steps whose top-attended key
   is the needle token being copied, ``attnprobe.heads.retrieval``) at the trained length over
   every depth, and compares them with the census' induction heads (on repeated-segment
   data); the ``retrieval`` column is joined to the census scores and classified again, so a
   ``retrieval`` label rule shows when the label registry has one;
2. measures, for every context length (48 .. 2,048 tokens) and depth, the teacher-forced copy
   accuracy, each head's retrieval score and (up to ``greedy_max_length``) the greedy
   continuation's token accuracy; the same with distractors (the needle's symbols also in
   the haystack);
3. ablates (``ap.perturb.perturbed(model, "zero", scope)``) the retrieval heads together, the
   other heads together and every head alone, and measures the copy accuracy after each;
4. explains what breaks beyond the trained length: each layer-0 head's mass on the previous
   token and on ``[BOS]``, by query position.

Tables (``runs/long_context/<stamp>/``): ``heads``, ``grid`` (accuracy per length and depth),
``retrieval`` (per head, length and depth), ``by_length``, ``distractors``, ``ablation``,
``positions``, ``checks``, ``summary``; figure ``long_context.png``.

Run: ``python analyses/long_context.py [--smoke] [--out DIR]`` (the full run takes a few
minutes; most of it is the 1,024- and 2,048-token contexts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from harness.runs import analysis_main

import attnprobe as ap
from attnprobe.heads.labels import classify_scores
from attnprobe.heads.retrieval import copy_accuracy, retrieval_scores
from attnprobe.models.induction import repeated_segments
from attnprobe.tasks.needle import greedy_continuation, needle_task

INDEX = ["stack", "kind", "layer", "head", "head_id"]


@dataclass
class Config:
    model: str = "ref:induction"
    lengths: tuple[int, ...] = (48, 64, 96, 128, 256, 512, 1024, 2048)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    n_examples: int = 32  # per (length, depth); fewer for long contexts (tokens_per_cell)
    tokens_per_cell: int = 16384
    needle_len: int = 12
    prefix_len: int = 2
    threshold: float = 0.1  # a retrieval head scores above it at the trained length
    reference_length: int = 48  # the trained length
    ablation_lengths: tuple[int, ...] = (48, 64)
    ablate_each_head: bool = True
    distractor_lengths: tuple[int, ...] = (48, 64, 128, 256)
    greedy_max_length: int = 512
    n_census: int = 64  # repeated-segment sequences for the census labels
    position_length: int = 256  # context of the layer-0 diagnostic
    position_bucket: int = 16
    attention_cells: int = 2**23  # batch size x length^2 per forward
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        return cls(lengths=(48, 96), depths=(0.0, 1.0), n_examples=4,
                   ablation_lengths=(48,), ablate_each_head=False, distractor_lengths=(48,),
                   greedy_max_length=48,
                   n_census=8, position_length=96)


def _batch(cfg: Config, length: int) -> int:
    return max(1, min(32, cfg.attention_cells // length**2))


def _n(cfg: Config, length: int) -> int:
    return max(2, min(cfg.n_examples, cfg.tokens_per_cell // length))


def _accuracy(table: pd.DataFrame) -> float:
    return float(table["correct"].sum() / table["copy_steps"].sum())


def _scope(heads: list[tuple[int, int]]) -> str:
    return "heads:" + ",".join(f"{layer}.{head}" for layer, head in heads)


def _task(cfg: Config, length: int, depth: float, seed: int, *, distinct: bool = True):
    return needle_task(_n(cfg, length), length=length, depth=depth,
                       needle_len=cfg.needle_len, prefix_len=cfg.prefix_len,
                       distinct=distinct, seed=seed)


def _cell(model, tok, cfg: Config, length: int, depth: float, seed: int, *,
          distinct: bool = True, greedy: bool = False) -> tuple[dict, pd.DataFrame]:
    task = _task(cfg, length, depth, seed, distinct=distinct)
    batch = _batch(cfg, length)
    scores = retrieval_scores(model, tok, task, batch_size=batch)
    accuracy = copy_accuracy(model, tok, task, batch_size=batch)
    row = {"length": length, "depth": depth, "distinct": distinct, "examples": len(accuracy),
           "copy_steps": int(accuracy["copy_steps"].sum()), "accuracy": _accuracy(accuracy),
           "retrieval_l1_mean": float(scores.loc[scores["layer"] == 1, "retrieval"].mean()),
           "greedy_accuracy": float("nan")}
    if greedy:
        row["greedy_accuracy"] = float(greedy_continuation(model, task,
                                                           batch_size=batch).float().mean())
    return row, scores.assign(length=length, depth=depth)


def _heads(model, tok, cfg: Config, reference: pd.DataFrame) -> tuple[pd.DataFrame, list]:
    """Census labels on repeated-segment data, with and without the retrieval column."""
    segments = repeated_segments(cfg.n_census, torch.Generator().manual_seed(2024 + cfg.seed),
                                 tok)
    texts = [" ".join(tok.convert_ids_to_tokens(row[1:].tolist()))
             for row in segments.input_ids]
    census = ap.heads.census(model, tok, texts, similarity=False, seed=cfg.seed)
    labels = census.classify()
    mean = reference.groupby(INDEX, as_index=False)[["retrieval"]].mean()
    joined = classify_scores(census.scores().merge(mean, on=INDEX, how="left"))
    table = labels[[*INDEX, "label", "prev", "induction"]].merge(
        joined[[*INDEX, "retrieval", "label", "also"]].rename(
            columns={"label": "label_with_retrieval"}), on=INDEX)
    found = [(int(r.layer), int(r.head)) for r in table.itertuples()
             if r.retrieval > cfg.threshold]
    table["retrieval_head"] = table["retrieval"] > cfg.threshold
    return table, found


def _ablation(model, tok, cfg: Config, found: list[tuple[int, int]]) -> pd.DataFrame:
    every = [(layer, head) for layer in range(model.config.n_layers)
             for head in range(model.config.n_heads)]
    others = [h for h in every if h not in found]
    conditions = {"none": None, "retrieval heads": found, "all other heads": others}
    if cfg.ablate_each_head:
        conditions.update({f"L{layer}H{head}": [(layer, head)] for layer, head in every})
    rows = []
    for length in cfg.ablation_lengths:
        task = _task(cfg, length, 0.5, cfg.seed + 7 * length)
        batch = _batch(cfg, length)
        base = _accuracy(copy_accuracy(model, tok, task, batch_size=batch))
        for name, heads in conditions.items():
            if heads is None:
                accuracy = base
            elif not heads:
                continue
            else:
                with ap.perturb.perturbed(model, "zero", _scope(heads)):
                    accuracy = _accuracy(copy_accuracy(model, tok, task, batch_size=batch))
            rows.append({"length": length, "ablated": name,
                         "heads": "" if heads is None else _scope(heads),
                         "accuracy": accuracy, "baseline": base, "drop": base - accuracy})
    return pd.DataFrame(rows)


def _positions(model, tok, cfg: Config) -> pd.DataFrame:
    """Layer 0's mass on the previous token and on [BOS], by query position."""
    task = _task(cfg, cfg.position_length, 0.5, cfg.seed + 99)
    with torch.no_grad(), ap.capture(model, "layer:0") as cap:
        model(task.input_ids[:4])
    pattern = torch.stack([m.pattern[0] for m in cap.maps])  # [example, head, q, k]
    q = torch.arange(1, pattern.shape[2])
    prev = pattern[:, :, q, q - 1].mean(0)  # [head, q - 1]
    bos = pattern[:, :, q, 0].mean(0)
    rows = []
    for start in range(1, pattern.shape[2], cfg.position_bucket):
        span = slice(start - 1, start - 1 + cfg.position_bucket)
        for head in range(pattern.shape[1]):
            rows.append({"from_position": start, "head_id": f"L0H{head}",
                         "prev_mass": float(prev[head, span].mean()),
                         "bos_mass": float(bos[head, span].mean()),
                         "trained": start < cfg.reference_length})
    return pd.DataFrame(rows)


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    model, tok = ap.load_model(cfg.model)
    cells, scores, distractors = [], [], []
    for i, length in enumerate(cfg.lengths):
        for j, depth in enumerate(cfg.depths):
            row, table = _cell(model, tok, cfg, length, depth, cfg.seed + 100 * i + j,
                               greedy=length <= cfg.greedy_max_length)
            cells.append(row)
            scores.append(table)
    for length in cfg.distractor_lengths:
        distractors.append(_cell(model, tok, cfg, length, 0.5, cfg.seed + 5000 + length,
                                 distinct=False)[0])
    grid = pd.DataFrame(cells)
    retrieval = pd.concat(scores, ignore_index=True)
    reference = retrieval[retrieval["length"] == cfg.reference_length]
    heads, found = _heads(model, tok, cfg, reference)
    induction = sorted((int(r.layer), int(r.head)) for r in heads.itertuples()
                       if r.label == "induction")
    ablation = _ablation(model, tok, cfg, found)
    by_length = grid.groupby("length", as_index=False).agg(
        accuracy=("accuracy", "mean"), accuracy_min=("accuracy", "min"),
        accuracy_max=("accuracy", "max"), retrieval_l1_mean=("retrieval_l1_mean", "mean"),
        greedy_accuracy=("greedy_accuracy", "mean"), examples=("examples", "sum"))
    positions = _positions(model, tok, cfg)
    ref_acc = float(by_length.loc[by_length["length"] == cfg.reference_length,
                                  "accuracy"].iloc[0])
    ablated = ablation[(ablation["length"] == cfg.reference_length)
                       & (ablation["ablated"] == "retrieval heads")]
    singles = ablation[(ablation["length"] == cfg.reference_length)
                       & ablation["ablated"].str.match(r"L\dH\d$")]
    circuit = found + [(int(r.layer), int(r.head)) for r in heads.itertuples()
                       if r.label == "previous"]
    outside = singles[~singles["ablated"].isin([f"L{a}H{b}" for a, b in circuit])]
    trained = positions[positions["trained"]].groupby("head_id")["prev_mass"].mean()
    beyond = positions[~positions["trained"]].groupby("head_id")["prev_mass"].mean()
    checks = pd.DataFrame([
        {"check": "retrieval heads (score > threshold at the trained length)",
         "value": ", ".join(f"L{a}H{b}" for a, b in found)},
        {"check": "census induction heads", "value": ", ".join(f"L{a}H{b}" for a, b in
                                                                 induction)},
        {"check": "retrieval heads == induction heads", "value": found == induction},
        {"check": f"copy accuracy at {cfg.reference_length} tokens", "value": ref_acc},
        {"check": "... with the retrieval heads zeroed",
         "value": float(ablated["accuracy"].iloc[0]) if len(ablated) else float("nan")},
        {"check": "... largest drop from zeroing one head outside the circuit (retrieval and "
                  "previous-token heads)",
         "value": float(outside["drop"].max()) if len(outside) else float("nan")},
        {"check": "longest length with copy accuracy >= 0.5",
         "value": int(by_length.loc[by_length["accuracy"] >= 0.5, "length"].max())
         if (by_length["accuracy"] >= 0.5).any() else 0},
        *({"check": f"{head} previous-token mass, trained / later positions",
           "value": f"{trained[head]:.2f} / {beyond[head]:.2f}"} for head in trained.index
          if head in beyond.index),
    ])
    summary = by_length[["length", "accuracy", "retrieval_l1_mean", "greedy_accuracy"]]
    return {"heads": heads, "grid": grid, "retrieval": retrieval, "by_length": by_length,
            "distractors": pd.DataFrame(distractors), "ablation": ablation,
            "positions": positions, "checks": checks, "summary": summary}


def plot(tables: dict[str, pd.DataFrame], folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = tables["grid"].pivot(index="depth", columns="length", values="accuracy")
    retrieval = tables["retrieval"].groupby(["length", "head_id"])["retrieval"].mean()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    image = left.imshow(grid.values, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    left.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns])
    left.set_yticks(range(grid.shape[0]), [f"{d:g}" for d in grid.index])
    left.set_xlabel("context length (tokens)")
    left.set_ylabel("needle depth")
    left.set_title("copy accuracy (teacher-forced)")
    fig.colorbar(image, ax=left)
    for head_id, series in retrieval.groupby(level="head_id"):
        right.plot(series.index.get_level_values("length"), series.values, marker="o",
                   label=head_id)
    right.set_xscale("log", base=2)
    right.set_xlabel("context length (tokens)")
    right.set_ylabel("retrieval score (mean over depths)")
    right.set_title("retrieval score per head")
    right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(folder / "long_context.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    analysis_main("long_context", __doc__, Config, run, plot, argv,
                  show=["summary", "heads", "distractors", "ablation", "checks"])


if __name__ == "__main__":
    main()

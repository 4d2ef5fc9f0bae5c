"""Benchmark: activation patching batched many patches per forward vs one patched forward at a
time, attribution patching vs activation patching, and a patched forward vs a plain one.

Four measurements, each side by side in one run (contenders interleaved A, B, A, B, ...; the
medians of ``repeats`` timed rounds after ``warmup`` untimed ones are compared):

1. **Every MiniLM head** (6 × 12 = 72), per-head output patching (``site="output"``, every
   position at once, denoising) on ``n`` pairs of equal token length (1 and 4 by default;
   16–20 tokens). MiniLM is an encoder, so the metric is a callable: the last layer's
   ``[CLS]`` state projected on a fixed direction drawn from ``seed``. Contenders:

   - ``batched``: ``ap.patch.heads(model, tok, clean, corrupt, metric)`` with the default
     ``batch_size`` (16 rows per forward: the pairs repeated once per patch);
   - ``one at a time``: the same call with ``batch_size = n`` — every forward then holds the
     ``n`` pairs with one patch, which is what a loop over heads with one patched forward
     each does, through the same capture seam, metric and table code (so the difference is
     the batching alone, not a slower hand-written loop);
   - for reference, ``batched, batch_size B`` (``larger_batch`` rows per forward).

2. **``ref:induction``'s 8 heads × every position** (``positions="each"``) of one 48-token
   sequence with a repeated segment (the corrupted input draws the first half afresh; metric
   ``logit:next`` at the second-copy positions): 384 patches, the same two contenders.

3. **Attribution patching** (``ap.patch.attribution``: two forwards and one backward) vs
   all-heads activation patching (``batched`` above) on the same inputs: the ratio (the
   issue expects 10× faster, a ratio of 0.1, at MiniLM size).

4. **A patched forward vs a plain SDPA forward** of the same ``forward_rows`` rows (the
   corrupted MiniLM inputs repeated): ``model(**batch)`` under ``no_grad``, against one forward
   under ``ap.capture(model, "layer:L", parts=[EditOutput(fn)])`` whose ``fn`` writes the
   clean run's stored output of head 0 into the batch (and the same on every layer).

Every comparison is checked inside the run: the batched and one-at-a-time tables have the
same rows in the same order, their numbers equal up to float rounding between batch shapes
(the largest difference is reported), and the patched forward's metric equals the batched
table's value for that head.

Timings run on ``threads`` torch threads (1 by default): on the shared 2-core machine, a
forward on two OpenMP threads waits on barriers whenever another process takes a core (one
MiniLM row took 540 ms instead of 24 ms under a load of 5), and one thread measures the work,
not the scheduler. The run prints how busy the rest of the machine was (``foreign_load``).

**Where the time goes.** A patched forward repeats the pairs once per patch from its first
patched layer on; the layers before it are not run again (they replay the base run's
outputs: :mod:`attnprobe.patch.late_tiling`). So the arithmetic of patching every head of
every layer cannot fall below ``Σ_L heads · (layers − L)`` layer-rows per pair: 252 for
MiniLM, 0.58 of the 432 of one full forward per head. What batching removes beyond that is
the cost of many small forwards (per-forward Python and hooks, and matrix products of a few
rows, which run at a third of the speed of 16-row ones on a CPU): most of one-at-a-time
patching with one pair, a shrinking share as the pairs (the rows of each forward) grow, where
the ratio tends to that arithmetic floor times the small-batch efficiency (about 0.4 on 4
pairs). Larger forwards (``larger_batch``) change little on a CPU, where a forward's time is
linear in its rows beyond about 16.

Run: ``python analyses/bench_patch.py [--smoke] [--out DIR]``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from harness.benchmarking import interleaved, load_warning, ratios, timing_table, with_result

import attnprobe as ap
from attnprobe.capture import Activations, EditOutput
from attnprobe.tasks.induction import held_out

PAIRS = (  # (clean, corrupt), each pair one token length under MiniLM's tokenizer
    ("The old man who lived near the quiet river walked slowly to the busy market every "
     "morning.",
     "The young girl who lived near the quiet river walked slowly to the busy market every "
     "evening."),  # 20 tokens
    ("The capital of France is Paris, and it is famous for its museums.",
     "The capital of Italy is Rome, and it is famous for its churches."),  # 17
    ("She opened the door and saw a small cat sleeping on the warm carpet.",
     "He opened the window and saw a large dog sleeping on the cold floor."),  # 17
    ("Every student in the class passed the difficult exam on the first try.",
     "No student in the school failed the easy test on the second day."),  # 16
)
NUMBERS = ["clean", "corrupt", "patched", "effect"]
BATCHED, SINGLE, ATTRIBUTION = "batched", "one at a time", "attribution"


@dataclass
class Config:
    """Sizes of the benchmark (defaults: the full run)."""

    model: str = "minilm"
    scope: str = "all"  # the MiniLM heads patched (all: 72)
    n_pairs: tuple[int, ...] = (1, 4)
    induction_len: int = 48  # tokens of the ref:induction sequence
    induction_scope: str = "all"
    larger_batch: int = 64  # rows per forward of the reference contender
    forward_rows: int = 64
    forward_layer: int = 3
    forward_head: int = 0
    repeats: int = 5
    warmup: int = 1
    threads: int = 1
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        """Tiny sizes: checks the script end to end in seconds (numbers are meaningless)."""
        return cls(scope="heads:4.3,5.0,5.11", n_pairs=(1, 2), induction_len=24,
                   induction_scope="layer:1", forward_rows=4, forward_layer=5, repeats=1,
                   warmup=0)


class Projection:
    """The metric for an encoder: the last layer's ``[CLS]`` state ``[batch, d]`` projected on
    a fixed unit direction ``[d]`` -> ``[batch]``."""

    def __init__(self, d: int, seed: int) -> None:
        direction = torch.randn(d, generator=torch.Generator().manual_seed(seed))
        self.direction = direction / direction.norm()

    def __call__(self, output: Any, batch: Any) -> torch.Tensor:
        return output.last_hidden_state[:, 0] @ self.direction


@dataclass(frozen=True)
class Task:
    """One patching workload: what both contenders are called with."""

    name: str
    model: Any
    tokenizer: Any
    clean: list
    corrupt: list
    metric: Any
    options: dict[str, Any]
    single_batch: int  # batch_size of one patch per forward: the number of pairs

    def heads(self, **extra: Any) -> Callable[[], pd.DataFrame]:
        return lambda: ap.patch.heads(self.model, self.tokenizer, self.clean, self.corrupt,
                                      self.metric, **self.options, **extra)

    def attribution(self) -> Callable[[], pd.DataFrame]:
        options = {k: v for k, v in self.options.items() if k != "per"}
        return lambda: ap.patch.attribution(self.model, self.tokenizer, self.clean,
                                            self.corrupt, self.metric, **options)


def larger(cfg: Config) -> str:
    return f"batched, batch_size {cfg.larger_batch}"


def compare(batched: pd.DataFrame, single: pd.DataFrame, name: str) -> dict[str, float]:
    """Same rows in the same order as contender ``name``'s table (1 = yes) and the largest
    difference of each number."""
    labels = [c for c in batched.columns if c not in NUMBERS]
    same = list(batched.columns) == list(single.columns) and \
        batched[labels].reset_index(drop=True).equals(single[labels].reset_index(drop=True))
    found = {f"same rows in the same order as {name} (1 = yes)": float(same)}
    for column in ("patched", "effect"):
        found[f"max |batched - {name}| {column}"] = float(
            (batched[column] - single[column]).abs().max()) if same else float("nan")
    return found


def timed_pair(task: Task, cfg: Config) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Time ``batched`` against ``one at a time`` (and attribution patching when the task
    allows it); returns the raw rows and each contender's last table."""
    contenders = {BATCHED: with_result(task.heads()),
                  SINGLE: with_result(task.heads(batch_size=task.single_batch)),
                  larger(cfg): with_result(task.heads(batch_size=cfg.larger_batch)),
                  ATTRIBUTION: with_result(task.attribution())}
    results: dict[str, Any] = {}
    with torch.no_grad():  # attribution patching enables gradients where it needs them
        raw = interleaved(contenders, repeats=cfg.repeats, warmup=cfg.warmup,
                          labels={"benchmark": task.name}, results=results)
    return raw, results


def minilm_tasks(model: Any, tokenizer: Any, cfg: Config) -> list[Task]:
    metric = Projection(model.config.hidden_size, cfg.seed)
    tasks = []
    for n in cfg.n_pairs:
        clean, corrupt = [c for c, _ in PAIRS[:n]], [x for _, x in PAIRS[:n]]
        tasks.append(Task(f"{cfg.model} heads ({cfg.scope}), output, {n} pair(s)", model,
                          tokenizer, clean, corrupt, metric, {"scope": cfg.scope}, n))
    return tasks


def induction_task(cfg: Config) -> Task:
    """One ``ref:induction`` sequence with a repeated segment and its corrupted twin (every
    symbol before the second copy drawn afresh), the metric at the second-copy positions."""
    model, tokenizer = ap.load_model("ref:induction")
    segments = held_out(1, tokenizer=tokenizer, seq_len=cfg.induction_len)
    row, source = segments.input_ids[0], segments.source[0]
    copy = (source >= 0).nonzero()[:, 0]
    start = int(copy[0])
    first = tokenizer.convert_tokens_to_ids(["t00"])[0]
    other = row.clone()
    generator = torch.Generator().manual_seed(cfg.seed)
    other[1:start] = first + torch.randint(0, 64, (start - 1,), generator=generator)
    return Task(f"ref:induction heads ({cfg.induction_scope}) x each of "
                f"{cfg.induction_len} positions, output, 1 sequence", model, tokenizer,
                [row.tolist()], [other.tolist()], "logit:next",
                {"scope": cfg.induction_scope, "positions": "each",
                 "metric_positions": [copy.tolist()]}, 1)


def stored_outputs(model: Any, inputs: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Every layer's per-head outputs ``[batch, head, query, d_head]`` of a run on ``inputs``."""
    with torch.no_grad(), ap.capture(model, parts=[Activations(("z",))]) as cap:
        model(**inputs)
    return {site.layer: found["z"] for site, found in cap.activations[0].items()}


def forward_benchmark(model: Any, tokenizer: Any, cfg: Config, table: pd.DataFrame
                      ) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """A forward patched on one layer (and on every layer) vs the plain SDPA forward of the
    same rows; checks the patched metric against the batched table's row of that head."""
    n = len(PAIRS)
    repeat = -(-cfg.forward_rows // n)

    def encoded(texts: Sequence[str]) -> dict[str, torch.Tensor]:
        found = tokenizer(list(texts) * repeat, return_tensors="pt", padding=True)
        return {k: found[k][:cfg.forward_rows] for k in ("input_ids", "attention_mask")}

    corrupt, clean = encoded([x for _, x in PAIRS]), encoded([c for c, _ in PAIRS])
    stored, head, layer = stored_outputs(model, clean), cfg.forward_head, cfg.forward_layer

    def write(at: int, z: torch.Tensor) -> torch.Tensor:  # [rows, head, query, d_head]
        z[:, head] = stored[at][:, head]
        return z

    def patched(scope: str) -> Callable[[], Any]:
        def go() -> Any:
            with ap.capture(model, scope, parts=[EditOutput(write)]):
                return model(**corrupt)
        return go

    plain = f"plain SDPA forward, {cfg.forward_rows} rows"
    one = f"patched on layer {layer} (head {head}), {cfg.forward_rows} rows"
    every = f"patched on every layer (head {head}), {cfg.forward_rows} rows"
    results: dict[str, Any] = {}
    with torch.no_grad():
        raw = interleaved({plain: with_result(lambda: model(**corrupt)),
                           one: with_result(patched(f"layer:{layer}")),
                           every: with_result(patched("all"))},
                          repeats=cfg.repeats, warmup=cfg.warmup,
                          labels={"benchmark": "patched vs plain forward"}, results=results)
    metric = Projection(model.config.hidden_size, cfg.seed)
    got = metric(results[one], corrupt)[:n].double().numpy()  # the first repeat of each pair
    row = table[(table["layer"] == layer) & (table["head"] == head)]
    checks = [{"check": "rows of the patched forward", "value": float(cfg.forward_rows)},
              {"check": f"max |patched forward - batched table| metric, L{layer}H{head}",
               "value": float(np.abs(got[:len(row)] - row["patched"].to_numpy()).max())
               if len(row) else float("nan")},
              {"check": "max |patched - plain| last hidden state",
               "value": float((results[one].last_hidden_state
                               - results[plain].last_hidden_state).abs().max())}]
    return raw, checks


def _summary_row(raw: pd.DataFrame, benchmark: str, ours: str, base: str, target: float | None
                 ) -> dict[str, Any]:
    rows = raw[raw["benchmark"] == benchmark]
    ratio = ratios(rows, ours, base)
    med = rows.groupby("contender")["seconds"].median()
    return {"benchmark": benchmark, "contender": ours, "baseline": base,
            "contender_s": float(med[ours]), "baseline_s": float(med[base]),
            "ratio": ratio["ratio_of_medians"], "median_paired_ratio":
            ratio["median_paired_ratio"], "target": target,
            "foreign_load": float(rows["foreign_load"].mean())}


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Time every benchmark's contenders and check they agree; return the tables (nothing is
    printed but a load warning)."""
    torch.set_num_threads(cfg.threads)
    model, tokenizer = ap.load_model(cfg.model)
    tasks = [*minilm_tasks(model, tokenizer, cfg), induction_task(cfg)]
    raws, summary, checks, tables = [], [], [], {}
    for task in tasks:
        raw, results = timed_pair(task, cfg)
        raws.append(raw)
        summary += [_summary_row(raw, task.name, BATCHED, SINGLE, 0.2),
                    _summary_row(raw, task.name, larger(cfg), SINGLE, None),
                    _summary_row(raw, task.name, ATTRIBUTION, BATCHED, 0.1)]
        for other in (SINGLE, larger(cfg)):
            found = compare(results[BATCHED], results[other], other)
            checks += [{"benchmark": task.name, "check": k, "value": v}
                       for k, v in found.items()]
        checks.append({"benchmark": task.name, "check": "patches x pairs (table rows)",
                       "value": float(len(results[BATCHED]))})
        tables[task.name] = results[BATCHED]
    raw, forward_checks = forward_benchmark(model, tokenizer, cfg, tables[tasks[-2].name])
    raws.append(raw)
    name = "patched vs plain forward"
    for contender in raw["contender"].unique()[1:]:
        summary.append(_summary_row(raw, name, contender, raw["contender"].iloc[0], 1.2))
    checks += [{"benchmark": name, **c} for c in forward_checks]
    checks.append({"benchmark": "all", "check": "torch threads",
                   "value": float(torch.get_num_threads())})
    raw = pd.concat(raws, ignore_index=True)
    warning = load_warning(float(raw["foreign_load"].mean()))
    if warning:
        print(warning)
    return {"summary": pd.DataFrame(summary),
            "timing": timing_table(raw, by=("benchmark", "contender")),
            "timing_raw": raw, "checks": pd.DataFrame(checks),
            "induction_table": tables[tasks[-1].name]}


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from harness.runs import analysis_main

    analysis_main("bench_patch", __doc__, Config, run, argv=argv,
                  show=["summary", "timing", "checks"])


if __name__ == "__main__":
    main()

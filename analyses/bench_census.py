"""Benchmark: what the head census costs next to a bare forward pass, and its memory on long input.

Two measurements, each side by side in one run:

1. **Census cost** on MiniLM over the ``n_sentences`` of ``data/census_sentences.txt``.
   The baseline is a bare forward pass of the model as loaded (SDPA) under
   ``torch.no_grad()``, over *the same batches the census runs*: sentences sorted by length,
   ``batch_size`` per batch, each encoded from its pre-split words exactly as the census
   encodes it (``attnprobe.heads.census_batches.plan_batches``). Both sides
   tokenize inside the timing: a forward pass over sentences starts from their text.
   The contender is the full census given pre-parsed trees: every streaming score,
   head distances (Jensen–Shannon), the repeated-token probe and the syntax counts, followed
   by the tables (``classify()``, ``syntax(min_count)``, ``distances()``). Parsing is input
   preparation: it runs once before timing and is reported as its own row, as are loading
   the spaCy pipeline and tokenizing the batches. A breakdown runs the census with parts
   switched off (no head distances; no syntax, i.e. raw texts; streaming reducers only; and
   without the repeated-token probe), so the cost of each part can be read off.
   Contenders are interleaved (bare, census, ..., bare, census, ...) so drift hits all; the
   headline is the ratio of medians census / bare (target ``<= speed_target``), with the
   median of per-round paired ratios beside it.

2. **Long input**: a tiny causal LLaMA (random init, seeded, eval mode, SDPA) on one input of
   each of ``llama_seq_lens`` tokens (8k and 32k; ``--smoke``: 512 and 1024). The census'
   streaming reducers (``census_reducers(None, max_offset=...)`` with ``keep=False``, then
   ``wide_scores``) vs one plain SDPA forward of the same input, timed side by side in this
   process (the default allocator, as users run it; the best of ``long_repeats`` interleaved
   rounds of each), their ratio (target ``<= long_speed_target``), the minor page faults of
   the best rounds, the same timing in a fresh process whose glibc keeps freed blocks on its
   heap (``KEPT_HEAP``: its default heuristics trim and regrow the heap between blocks, and
   the fresh pages fault in), and the time exponents between the lengths
   (``log(t2 / t1) / log(L2 / L1)``; target: the census' within ``exponent_tolerance`` of the
   forward's). Memory: peak RSS above a pre-forward baseline is
   read from ``VmHWM`` after resetting it (``reset_peak_rss``); each mode runs in a fresh
   subprocess (``memory_subprocess``) so no heap left by another measurement hides its
   allocations. Full maps (``keep=True``) are measured where they fit comfortably
   (``layers x heads x L^2 x 4`` bytes within ``full_maps_max_share`` of ``MemAvailable``),
   else that figure is reported; target: streaming ``<= memory_share_target`` of it.
   Streaming scores are checked against the same scores computed from full maps (float64) on
   a shorter input (``check_seq_len``), to ``entropy_tolerance``.

Run: ``python analyses/bench_census.py [--smoke] [--out DIR]``; tables and
``provenance.json`` go to ``runs/bench_census/<UTC stamp>/``.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from harness.benchmarking import (
    Contender,
    FromDict,
    interleaved,
    load_warning,
    run_json_child,
    timing_table,
)
from harness.runs import analysis_main, memory_status_kib, reset_peak_rss

import attnprobe
from attnprobe.core.lines import split_lines
from attnprobe.heads import census, parse
from attnprobe.heads.census_batches import plan_batches
from attnprobe.heads.scores import census_reducers, wide_scores
from attnprobe.heads.trees import default_pipeline
from attnprobe.inputs.text import model_inputs, pad_ids

DATA = Path(__file__).resolve().parent / "data"
CHILD_FLAG = "--_memory-child"  # hidden: one memory measurement in a fresh process, prints JSON
TIMED_FLAG = "--_timed-child"  # hidden: the long-input timing in a fresh process, prints JSON
# glibc told to keep freed blocks on its heap: with its default, dynamic thresholds the heap
# top is trimmed and regrown between blocks, and the fresh pages fault in (seen: 50k-450k
# minor faults for the same 8,192-token census, 1.1-1.7 s)
KEPT_HEAP = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
MODES = ("streaming", "full", "plain")
MIB = 1024.0  # KiB per MiB
BARE = "bare forward (SDPA, same batches, tokenizing included)"
FULL = "census (full: scores, distances, probe, syntax)"


@dataclass
class Config(FromDict):
    """Sizes and targets (defaults: the full run)."""

    model: str = "minilm"
    corpus: str = "census_sentences.txt"  # under analyses/data/
    n_sentences: int = 1000
    batch_size: int = 32
    min_count: int = 10  # syntax table
    repeats: int = 5
    warmup: int = 1
    breakdown: bool = True
    speed_target: float = 1.2
    llama_hidden: int = 64
    llama_layers: int = 2
    llama_heads: int = 4
    llama_intermediate: int = 128
    llama_vocab: int = 1000
    llama_init_range: float = 0.2  # larger than HF's 0.02 so heads are not near-uniform
    llama_seq_lens: tuple[int, ...] = (8192, 32768)
    long_repeats: int = 3
    long_speed_target: float = 10.0
    memory_share_target: float = 1 / 50
    exponent_tolerance: float = 0.15
    check_seq_len: int = 1024
    max_offset: int = 64
    entropy_chunk: int = 256  # query rows per float64 chunk for scores from full maps
    entropy_tolerance: float = 1e-6
    full_maps_max_share: float = 0.25  # of MemAvailable; above it full maps are not kept
    memory_subprocess: bool = True
    child_timeout_s: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        self.llama_seq_lens = tuple(int(n) for n in self.llama_seq_lens)  # from JSON: a list

    @classmethod
    def smoke(cls) -> Config:
        """40 sentences, one repeat, short LLaMA inputs, memory measured in-process."""
        return cls(n_sentences=40, repeats=1, warmup=0, llama_seq_lens=(512, 1024),
                   check_seq_len=256, memory_subprocess=False, long_repeats=1)


# ----------------------------------------------------------------------------- timing helpers
def _timing_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Medians per contender and their ratios to the bare forward."""
    return timing_table(raw, BARE, medians=["run_s", "tables_s"]).rename(columns={
        "ratio_to_baseline": "ratio_to_bare", "extra_over_baseline_s": "extra_over_bare_s"})


# ----------------------------------------------------------------------------- part 1: census
def _sentences(cfg: Config) -> list[str]:
    lines = [line.strip() for line in split_lines((DATA / cfg.corpus).read_text(encoding="utf-8"))]
    texts = [line for line in lines if line]
    if len(texts) < cfg.n_sentences:
        raise ValueError(f"{cfg.corpus} has {len(texts)} sentences, fewer than {cfg.n_sentences}")
    return texts[:cfg.n_sentences]


def _census_cost(cfg: Config) -> dict[str, pd.DataFrame]:
    model, tokenizer = attnprobe.load_model(cfg.model)
    texts = _sentences(cfg)
    prep = []
    start = time.perf_counter()
    default_pipeline()
    prep.append({"step": "load spaCy pipeline", "seconds": time.perf_counter() - start})
    start = time.perf_counter()
    trees = parse(texts)
    prep.append({"step": f"parse {len(texts)} sentences (spaCy)",
                 "seconds": time.perf_counter() - start})

    # the census' own batches: sorted by length, encoded from the trees' pre-split words
    start = time.perf_counter()
    groups, _ = plan_batches(model, tokenizer, trees=trees, batch_size=cfg.batch_size)
    encoded = [group.inputs()[0] for group in groups]
    prep.append({"step": f"tokenize into {len(groups)} batches (timed on both sides)",
                 "seconds": time.perf_counter() - start})
    real = sum(int(b["attention_mask"].sum()) for b in encoded)
    padded = sum(b["input_ids"].numel() for b in encoded)

    def bare() -> dict[str, float]:
        for group in groups:  # tokenized here, as the census tokenizes (once, when planning)
            words = [list(it.tree.words) for it in group.sentences]
            ids = tokenizer(words, is_split_into_words=True)["input_ids"]
            model(**model_inputs(model, pad_ids(model, tokenizer, ids)))
        return {}

    results: dict[str, Any] = {}

    def run_census(name: str, tables: Callable[[Any], None], **kwargs: Any) -> Contender:
        def go() -> dict[str, float]:
            t0 = time.perf_counter()
            result = census(model, tokenizer, batch_size=cfg.batch_size, **kwargs)
            t1 = time.perf_counter()
            tables(result)
            t2 = time.perf_counter()
            results[name] = result
            return {"run_s": t1 - t0, "tables_s": t2 - t1}
        return go

    def full_tables(c: Any) -> None:
        c.classify()
        c.syntax(cfg.min_count)
        c.distances()

    contenders: dict[str, Contender] = {
        BARE: bare,
        FULL: run_census(FULL, full_tables, trees=trees),
    }
    if cfg.breakdown:
        contenders.update({
            "census, no head distances": run_census(
                "nosim", lambda c: (c.classify(), c.syntax(cfg.min_count)), trees=trees,
                similarity=False),
            "census, no syntax (texts)": run_census(
                "nosyntax", lambda c: (c.classify(), c.distances()), texts=texts),
            "census, streaming only (texts, no distances)": run_census(
                "streaming", lambda c: c.classify(), texts=texts, similarity=False),
            "census, streaming only, no probe": run_census(
                "streaming_noprobe", lambda c: c.scores(), texts=texts, similarity=False,
                repeated=False),
        })
    with torch.no_grad():
        raw = interleaved(contenders, repeats=cfg.repeats, warmup=cfg.warmup)
    timing = _timing_table(raw)

    checks = [{"check": "1: sentences in the census", "value": float(results[FULL].n_sentences)},
              {"check": "1: real tokens / padded tokens in the batches",
               "value": real / padded},
              {"check": "1: mean CPU load of other processes during timing (cores)",
               "value": float(raw["foreign_load"].mean())}]
    if cfg.breakdown:  # parts switched off must not change the streaming scores
        full = results[FULL].scores().set_index("head_id")
        nosim = results["nosim"].scores().set_index("head_id")
        diff = (full["entropy"] - nosim["entropy"]).abs().max()
        checks.append({"check": "1: max |entropy full census - census without distances|",
                       "value": float(diff)})
    prep_frame = pd.DataFrame(prep)
    prep_frame["ratio_to_bare"] = prep_frame["seconds"] / float(
        timing.loc[timing["contender"] == BARE, "median_s"].iloc[0])
    return {"timing": timing, "timing_raw": raw, "prep": prep_frame, "checks": checks,
            "batches": pd.DataFrame([{"sentences": sum(len(g.sentences) for g in groups),
                                      "batches": len(groups),
                                      "batch_size": cfg.batch_size, "real_tokens": real,
                                      "padded_tokens": padded}])}


# ----------------------------------------------------------------------------- part 2: memory
def _tiny_llama(cfg: Config) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        hidden_size=cfg.llama_hidden, num_hidden_layers=cfg.llama_layers,
        num_attention_heads=cfg.llama_heads, num_key_value_heads=cfg.llama_heads,
        intermediate_size=cfg.llama_intermediate, vocab_size=cfg.llama_vocab,
        max_position_embeddings=max(8192, *cfg.llama_seq_lens, cfg.check_seq_len),
        initializer_range=cfg.llama_init_range)
    torch.manual_seed(cfg.seed)
    return LlamaModel(config).eval()


def _llama_ids(cfg: Config, length: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.randint(0, cfg.llama_vocab, (1, length), generator=gen)


def _scores_from_maps(maps: list, chunk: int) -> dict[str, torch.Tensor]:
    """Mean row entropy, max weight and normalized entropy per ``[layer, head]``, float64.

    ``entropy_norm`` divides by ln(keys the row may see), i.e. the causal row ``i`` sees
    ``i + 1`` keys; rows that see a single key are not counted (as in the reducer).
    """
    (amap,) = maps
    p = amap.pattern  # [layer, head, query, key]
    entropy = torch.zeros(p.shape[:2], dtype=torch.float64)
    norm = torch.zeros_like(entropy)
    peak = torch.zeros_like(entropy)
    n = p.shape[2]
    for start in range(0, n, chunk):
        a = p[:, :, start:start + chunk].to(torch.float64)
        h = -torch.special.xlogy(a, a).sum(-1)  # [layer, head, rows]
        visible = torch.arange(start, start + a.shape[2], dtype=torch.float64) + 1
        several = visible > 1
        entropy += h.sum(-1)
        norm += (h[..., several] / visible[several].log()).sum(-1)
        peak += a.amax(-1).sum(-1)
        del a, h
    return {"entropy": entropy / n, "entropy_norm": norm / (n - 1), "max_weight": peak / n}


def _grid(frame: pd.DataFrame, column: str, cfg: Config) -> torch.Tensor:
    out = torch.full((cfg.llama_layers, cfg.llama_heads), float("nan"), dtype=torch.float64)
    for layer, head, value in frame[["layer", "head", column]].itertuples(index=False):
        out[int(layer), int(head)] = float(value)
    return out


def _streaming_scores(model: torch.nn.Module, ids: torch.Tensor, cfg: Config) -> pd.DataFrame:
    reducers = census_reducers(None, max_offset=cfg.max_offset)
    with attnprobe.capture(model, keep=False, reducers=reducers) as cap:
        model(input_ids=ids)
    return wide_scores(cap.tally)


def _trim_heap() -> None:
    """Hand freed heap memory back to the OS (glibc), so later allocations show in RSS."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _memory_measure(mode: str, cfg: Config, seq_len: int) -> dict[str, Any]:
    """One forward of ``mode`` on ``seq_len`` tokens; peak RSS above a baseline (KiB)."""
    model = _tiny_llama(cfg)
    ids = _llama_ids(cfg, seq_len)

    def forward(inputs: torch.Tensor) -> dict[str, list]:
        if mode == "streaming":
            frame = _streaming_scores(model, inputs, cfg)
            return {k: _grid(frame, k, cfg).tolist()
                    for k in ("entropy", "entropy_norm", "max_weight")}
        if mode == "full":
            with attnprobe.capture(model) as cap:
                model(input_ids=inputs)
            scores = _scores_from_maps(cap.maps, cfg.entropy_chunk)
            del cap
            return {k: v.tolist() for k, v in scores.items()}
        model(input_ids=inputs)
        return {}

    with torch.no_grad():
        forward(ids[:, :64])  # lazy one-time initialisation is not counted
        _trim_heap()
        baseline = memory_status_kib()["VmRSS"]
        reset = reset_peak_rss()
        start = time.perf_counter()
        scores = forward(ids)
        seconds = time.perf_counter() - start
        peak = memory_status_kib()["VmHWM"]
    return {"mode": mode, "attn_implementation": model.config._attn_implementation,
            "seq_len": seq_len, "seconds": seconds, "baseline_kib": baseline,
            "peak_kib": peak, "hwm_reset_works": reset, "scores": scores}


def _run_memory(mode: str, cfg: Config, seq_len: int) -> dict[str, Any]:
    if not cfg.memory_subprocess:
        _trim_heap()
        return _memory_measure(mode, cfg, seq_len)
    return run_json_child([str(Path(__file__).resolve()), CHILD_FLAG, mode,
                           json.dumps(asdict(cfg)), str(seq_len)],
                          timeout_s=cfg.child_timeout_s, what=f"memory child ({mode})")


def _mem_available_kib() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def _timed(cfg: Config, seq_len: int) -> dict[str, float]:
    """Seconds of the streaming census and of one plain SDPA forward on the same input, the
    best of ``long_repeats`` rounds each, interleaved (plain, census, plain, census, ...) in
    this process (its default allocator: the memory children fix glibc's mmap threshold,
    which slows every large allocation)."""
    model = _tiny_llama(cfg)
    ids = _llama_ids(cfg, seq_len)
    times: dict[str, list[float]] = {"plain_s": [], "streaming_s": []}
    faults: dict[str, list[int]] = {"plain_s": [], "streaming_s": []}
    with torch.no_grad():
        model(input_ids=ids[:, :64])
        _streaming_scores(model, ids[:, :64], cfg)
        for _ in range(cfg.long_repeats):
            for name, run in (("plain_s", lambda: model(input_ids=ids)),
                              ("streaming_s", lambda: _streaming_scores(model, ids, cfg))):
                _trim_heap()
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
                faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    best = {name: min(range(len(seconds)), key=seconds.__getitem__)
            for name, seconds in times.items()}
    return {**{name: times[name][i] for name, i in best.items()},
            **{name.replace("_s", "_faults"): faults[name][i] for name, i in best.items()}}


def _timed_kept_heap(cfg: Config, seq_len: int) -> dict[str, float]:
    """:func:`_timed` in a fresh process whose glibc keeps freed blocks (:data:`KEPT_HEAP`)."""
    found = run_json_child([str(Path(__file__).resolve()), TIMED_FLAG, json.dumps(asdict(cfg)),
                            str(seq_len)], timeout_s=cfg.child_timeout_s,
                           what="timing child (kept heap)", env=KEPT_HEAP)
    return {f"{name}_kept_heap": value for name, value in found.items()}


def _one_length(cfg: Config, seq_len: int) -> tuple[list[dict], dict[str, Any]]:
    """Memory rows (measured modes and the full maps' arithmetic) and the timing of one
    input length."""
    full_bytes = cfg.llama_layers * cfg.llama_heads * seq_len ** 2 * 4
    keep_full = full_bytes <= cfg.full_maps_max_share * _mem_available_kib() * 1024
    results = {mode: _run_memory(mode, cfg, seq_len) for mode in MODES
               if keep_full or mode != "full"}
    rows = []
    for mode, r in results.items():
        rows.append({"mode": mode, "attn_implementation": r["attn_implementation"],
                     "seq_len": seq_len, "seconds": r["seconds"],
                     "baseline_rss_mib": r["baseline_kib"] / MIB,
                     "peak_above_baseline_mib": (r["peak_kib"] - r["baseline_kib"]) / MIB,
                     "method": "VmHWM after reset" if r["hwm_reset_works"]
                     else "VmHWM (reset failed: includes earlier peaks)",
                     "measured": True})
    rows.append({"mode": "full maps, computed (layers x heads x L^2 x 4 B)",
                 "attn_implementation": "", "seq_len": seq_len,
                 "seconds": float("nan"), "baseline_rss_mib": float("nan"),
                 "peak_above_baseline_mib": full_bytes / 2 ** 20, "method": "arithmetic",
                 "measured": False})
    streaming_mib = rows[0]["peak_above_baseline_mib"]
    full_mib = next(r["peak_above_baseline_mib"] for r in rows if r["mode"] == "full") \
        if keep_full else full_bytes / 2 ** 20
    speed = {"seq_len": seq_len, **_timed(cfg, seq_len), **_timed_kept_heap(cfg, seq_len),
             "streaming_peak_mib": streaming_mib, "full_maps_mib": full_mib,
             "full_maps": "measured" if keep_full else "computed"}
    speed["ratio"] = speed["streaming_s"] / speed["plain_s"]
    speed["ratio_kept_heap"] = speed["streaming_s_kept_heap"] / speed["plain_s_kept_heap"]
    speed["memory_share"] = streaming_mib / full_mib
    if keep_full:
        speed["full_scores"] = results["full"]["scores"]
        speed["streaming_scores"] = results["streaming"]["scores"]
    return rows, speed


def _long_input(cfg: Config) -> dict[str, Any]:
    memory_rows, speeds = [], []
    for seq_len in cfg.llama_seq_lens:
        rows, speed = _one_length(cfg, seq_len)
        memory_rows += rows
        speeds.append(speed)
    memory = pd.DataFrame(memory_rows)
    long_speed = pd.DataFrame([{k: v for k, v in s.items() if not k.endswith("_scores")}
                               for s in speeds])

    # correctness: streaming scores vs the same scores from full maps, on a shorter input
    model = _tiny_llama(cfg)
    ids = _llama_ids(cfg, cfg.check_seq_len)
    with torch.no_grad():
        streaming = _streaming_scores(model, ids, cfg)
        with attnprobe.capture(model) as cap:
            model(input_ids=ids)
        reference = _scores_from_maps(cap.maps, cfg.entropy_chunk)
    del cap, model
    check_rows = []

    def compare(seq_len: int, ours_of: Callable[[str], torch.Tensor],
                reference: dict[str, Any]) -> None:
        for name, ref in reference.items():
            ours, ref = ours_of(name), torch.as_tensor(ref, dtype=torch.float64)
            for layer in range(cfg.llama_layers):
                for head in range(cfg.llama_heads):
                    s, f = float(ours[layer, head]), float(ref[layer, head])
                    check_rows.append({"seq_len": seq_len, "score": name, "layer": layer,
                                       "head": head, "head_id": attnprobe.head_id(layer, head),
                                       "streaming": s, "from_full_maps": f,
                                       "abs_diff": abs(s - f)})

    compare(cfg.check_seq_len, lambda name: _grid(streaming, name, cfg), reference)
    for speed in speeds:  # the long runs' own scores too, where full maps were kept
        if "full_scores" in speed:
            compare(speed["seq_len"], lambda name, speed=speed: torch.tensor(
                speed["streaming_scores"][name], dtype=torch.float64), speed["full_scores"])
    return {"memory": memory, "long_speed": long_speed,
            "agreement": pd.DataFrame(check_rows)}


def _exponent(frame: pd.DataFrame, column: str) -> float:
    """``log(t_last / t_first) / log(L_last / L_first)`` over the measured lengths."""
    first, last = frame.iloc[0], frame.iloc[-1]
    return math.log(last[column] / first[column]) / math.log(last["seq_len"] / first["seq_len"])


def _library_fingerprint() -> pd.DataFrame:
    """Hash of the library's sources: the working tree may differ from the git commit."""
    root = Path(attnprobe.__file__).resolve().parent
    files = sorted(root.rglob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    newest = max(path.stat().st_mtime for path in files)
    return pd.DataFrame([{"files": len(files), "sha256_12": digest.hexdigest()[:12],
                          "newest_mtime_utc": pd.Timestamp(newest, unit="s").isoformat()}])


# ----------------------------------------------------------------------------- run
def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Both benchmarks; returns the tables (nothing is printed)."""
    source = _library_fingerprint()
    cost = _census_cost(cfg)
    gc.collect()
    long = _long_input(cfg)

    timing = cost["timing"]
    med = timing.set_index("contender")["median_s"]
    paired = timing.set_index("contender")["median_paired_ratio"]
    speed = long["long_speed"]
    agreement = long["agreement"]
    short = agreement[agreement["seq_len"] == cfg.check_seq_len]
    entropy_diff = float(short.loc[short["score"] == "entropy", "abs_diff"].max())
    long_checked = agreement[agreement["seq_len"] != cfg.check_seq_len]

    checks = pd.DataFrame([
        *cost["checks"],
        {"check": f"2: max |streaming - full-map entropy| at {cfg.check_seq_len} tokens (nats)",
         "value": entropy_diff},
        {"check": f"2: max |streaming - full-map score| at {cfg.check_seq_len} tokens, "
                  "entropy/entropy_norm/max_weight", "value": float(short["abs_diff"].max())},
        {"check": "2: max |streaming - full-map score| at the long lengths with full maps",
         "value": float(long_checked["abs_diff"].max()) if len(long_checked)
         else float("nan")},
    ])
    rows = [
        {"benchmark": f"1. census / bare forward, {cfg.n_sentences} sentences (ratio of medians)",
         "ours": float(med[FULL]), "baseline": float(med[BARE]), "unit": "s",
         "ratio": float(med[FULL] / med[BARE]), "target": f"<= {cfg.speed_target:g}",
         "pass": bool(med[FULL] / med[BARE] <= cfg.speed_target)},
        {"benchmark": "1. census / bare forward (median of paired per-round ratios)",
         "ours": float("nan"), "baseline": float("nan"), "unit": "",
         "ratio": float(paired[FULL]), "target": f"<= {cfg.speed_target:g}",
         "pass": bool(paired[FULL] <= cfg.speed_target)},
    ]
    for r in speed.itertuples(index=False):
        rows.append({"benchmark": f"2. streaming census / plain SDPA forward, 1x{r.seq_len}",
                     "ours": r.streaming_s, "baseline": r.plain_s, "unit": "s",
                     "ratio": r.ratio, "target": f"<= {cfg.long_speed_target:g}",
                     "pass": bool(r.ratio <= cfg.long_speed_target)})
        rows.append({"benchmark": f"2. ... the same, glibc keeping freed blocks "
                                  f"(MALLOC_MMAP_THRESHOLD_ 32 MiB, MALLOC_TRIM_THRESHOLD_ "
                                  f"256 MiB), 1x{r.seq_len}",
                     "ours": r.streaming_s_kept_heap, "baseline": r.plain_s_kept_heap,
                     "unit": "s", "ratio": r.ratio_kept_heap,
                     "target": f"<= {cfg.long_speed_target:g}",
                     "pass": bool(r.ratio_kept_heap <= cfg.long_speed_target)})
        rows.append({"benchmark": f"2. streaming census reducers vs full maps ({r.full_maps}), "
                                  f"peak RSS, 1x{r.seq_len}",
                     "ours": r.streaming_peak_mib, "baseline": r.full_maps_mib,
                     "unit": "MiB above baseline", "ratio": r.memory_share,
                     "target": f"<= {cfg.memory_share_target:.3g}",
                     "pass": bool(r.memory_share <= cfg.memory_share_target)})
    if len(speed) > 1:
        ours, base = _exponent(speed, "streaming_s"), _exponent(speed, "plain_s")
        rows.append({"benchmark": f"2. time exponent, streaming census vs plain forward "
                                  f"({speed['seq_len'].iloc[0]}..{speed['seq_len'].iloc[-1]})",
                     "ours": ours, "baseline": base, "unit": "log t / log L",
                     "ratio": ours - base, "target": f"|diff| <= {cfg.exponent_tolerance:g}",
                     "pass": bool(abs(ours - base) <= cfg.exponent_tolerance)})
    rows.append({"benchmark": f"2. streaming entropy == full-map entropy at "
                              f"{cfg.check_seq_len} tokens",
                 "ours": entropy_diff, "baseline": cfg.entropy_tolerance,
                 "unit": "nats (max |diff|)", "ratio": float("nan"),
                 "target": f"<= {cfg.entropy_tolerance:g}",
                 "pass": bool(entropy_diff <= cfg.entropy_tolerance)})
    return {"timing": timing, "timing_raw": cost["timing_raw"], "prep": cost["prep"],
            "batches": cost["batches"], "memory": long["memory"], "long_speed": speed,
            "agreement": agreement, "checks": checks, "summary": pd.DataFrame(rows),
            "source": source}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == CHILD_FLAG:  # hidden: one memory measurement in a fresh process
        print(json.dumps(_memory_measure(argv[1], Config.from_dict(json.loads(argv[2])),
                                         int(argv[3]))))
        return
    if argv and argv[0] == TIMED_FLAG:  # hidden: the long-input timing in a fresh process
        print(json.dumps(_timed(Config.from_dict(json.loads(argv[1])), int(argv[2]))))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    out = analysis_main("bench_census", __doc__, Config, run, None, argv,
                        show=["prep", "timing", "memory", "long_speed", "checks", "summary"])
    summary = pd.read_csv(out / "summary.csv")
    print()
    for row in summary.to_dict("records"):  # side by side: ours, baseline, ratio, target
        verdict = "" if pd.isna(row["pass"]) else " pass" if row["pass"] else " MISS"
        print(f"{row['benchmark']}: {row['ours']:.4g} vs {row['baseline']:.4g} "
              f"{row['unit'] or ''} -> {row['ratio']:.4g} (target {row['target']}){verdict}")
    warning = load_warning(float(pd.read_csv(out / "timing_raw.csv")["foreign_load"].mean()))
    if warning:
        print(warning)


if __name__ == "__main__":
    main()

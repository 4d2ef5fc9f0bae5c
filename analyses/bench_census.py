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
   ``llama_seq_len`` tokens. The census' streaming reducers
   (``census_reducers(None, max_offset=...)`` with ``keep=False``, then ``wide_scores``) vs
   capture with full maps kept (``keep=True``), and the plain forward as the floor both stand
   on. Peak RSS above a pre-forward baseline is read from ``VmHWM`` after resetting it
   (``reset_peak_rss``); each mode runs in a fresh subprocess (``memory_subprocess``) so no
   heap left by another measurement hides its allocations. If full maps would not fit
   comfortably (``layers x heads x L^2 x 4`` bytes above ``full_maps_max_share`` of
   ``MemAvailable``) the full run is skipped and that figure is reported instead. Streaming
   scores are checked against the same scores computed from full maps (float64) on a shorter
   input (``check_seq_len``), to ``entropy_tolerance``.

Run: ``python analyses/bench_census.py [--smoke] [--out DIR]``; tables and
``provenance.json`` go to ``runs/bench_census/<UTC stamp>/``.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import os
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
from attnprobe.heads import census, parse
from attnprobe.heads.census_batches import plan_batches
from attnprobe.heads.scores import census_reducers, wide_scores
from attnprobe.heads.trees import default_pipeline

DATA = Path(__file__).resolve().parent / "data"
CHILD_FLAG = "--_memory-child"  # hidden: one memory measurement in a fresh process, prints JSON
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
    speed_target: float = 1.3
    llama_hidden: int = 64
    llama_layers: int = 2
    llama_heads: int = 4
    llama_intermediate: int = 128
    llama_vocab: int = 1000
    llama_init_range: float = 0.2  # larger than HF's 0.02 so heads are not near-uniform
    llama_seq_len: int = 8192
    check_seq_len: int = 1024
    max_offset: int = 64
    entropy_chunk: int = 256  # query rows per float64 chunk for scores from full maps
    entropy_tolerance: float = 1e-6
    full_maps_max_share: float = 0.25  # of MemAvailable; above it full maps are not kept
    memory_subprocess: bool = True
    child_timeout_s: float = 600.0
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        """40 sentences, one repeat, short LLaMA input, memory measured in-process."""
        return cls(n_sentences=40, repeats=1, warmup=0, llama_seq_len=1024, check_seq_len=256,
                   memory_subprocess=False)


# ----------------------------------------------------------------------------- timing helpers
def _timing_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Medians per contender and their ratios to the bare forward."""
    return timing_table(raw, BARE, medians=["run_s", "tables_s"]).rename(columns={
        "ratio_to_baseline": "ratio_to_bare", "extra_over_baseline_s": "extra_over_bare_s"})


# ----------------------------------------------------------------------------- part 1: census
def _sentences(cfg: Config) -> list[str]:
    lines = [line.strip() for line in (DATA / cfg.corpus).read_text().splitlines()]
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
        for group in groups:
            model(**group.inputs()[0])
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
        max_position_embeddings=max(8192, cfg.llama_seq_len, cfg.check_seq_len),
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


def _memory_measure(mode: str, cfg: Config) -> dict[str, Any]:
    """One forward of ``mode`` on ``llama_seq_len`` tokens; peak RSS above a baseline (KiB)."""
    model = _tiny_llama(cfg)
    ids = _llama_ids(cfg, cfg.llama_seq_len)

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
            "seq_len": cfg.llama_seq_len, "seconds": seconds, "baseline_kib": baseline,
            "peak_kib": peak, "hwm_reset_works": reset, "scores": scores}


def _run_memory(mode: str, cfg: Config) -> dict[str, Any]:
    if not cfg.memory_subprocess:
        _trim_heap()
        return _memory_measure(mode, cfg)
    return run_json_child([str(Path(__file__).resolve()), CHILD_FLAG, mode,
                           json.dumps(asdict(cfg))],
                          timeout_s=cfg.child_timeout_s, what=f"memory child ({mode})")


def _mem_available_kib() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def _long_input(cfg: Config) -> dict[str, Any]:
    full_bytes = cfg.llama_layers * cfg.llama_heads * cfg.llama_seq_len ** 2 * 4
    available = _mem_available_kib() * 1024
    keep_full = full_bytes <= cfg.full_maps_max_share * available
    modes = [m for m in MODES if keep_full or m != "full"]
    results = {mode: _run_memory(mode, cfg) for mode in modes}
    rows = []
    for mode, r in results.items():
        rows.append({"mode": mode, "attn_implementation": r["attn_implementation"],
                     "seq_len": r["seq_len"], "seconds": r["seconds"],
                     "baseline_rss_mib": r["baseline_kib"] / MIB,
                     "peak_above_baseline_mib": (r["peak_kib"] - r["baseline_kib"]) / MIB,
                     "method": "VmHWM after reset" if r["hwm_reset_works"]
                     else "VmHWM (reset failed: includes earlier peaks)",
                     "measured": True})
    rows.append({"mode": "full maps, computed (layers x heads x L^2 x 4 B)",
                 "attn_implementation": "", "seq_len": cfg.llama_seq_len,
                 "seconds": float("nan"), "baseline_rss_mib": float("nan"),
                 "peak_above_baseline_mib": full_bytes / 2 ** 20, "method": "arithmetic",
                 "measured": False})
    memory = pd.DataFrame(rows)

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
    for name, ref in reference.items():
        ours = _grid(streaming, name, cfg)
        for layer in range(cfg.llama_layers):
            for head in range(cfg.llama_heads):
                s, f = float(ours[layer, head]), float(ref[layer, head])
                check_rows.append({"seq_len": cfg.check_seq_len, "score": name, "layer": layer,
                                   "head": head, "head_id": attnprobe.head_id(layer, head),
                                   "streaming": s, "from_full_maps": f, "abs_diff": abs(s - f)})
    if keep_full:  # the long run's own scores too
        for name in results["full"]["scores"]:
            ours = torch.tensor(results["streaming"]["scores"][name], dtype=torch.float64)
            ref = torch.tensor(results["full"]["scores"][name], dtype=torch.float64)
            for layer in range(cfg.llama_layers):
                for head in range(cfg.llama_heads):
                    s, f = float(ours[layer, head]), float(ref[layer, head])
                    check_rows.append({"seq_len": cfg.llama_seq_len, "score": name,
                                       "layer": layer, "head": head,
                                       "head_id": attnprobe.head_id(layer, head),
                                       "streaming": s, "from_full_maps": f,
                                       "abs_diff": abs(s - f)})
    agreement = pd.DataFrame(check_rows)
    return {"memory": memory, "agreement": agreement, "full_bytes": full_bytes,
            "keep_full": keep_full}


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
    memory = long["memory"].set_index("mode")["peak_above_baseline_mib"]
    streaming_mib = float(memory["streaming"])
    full_mib = float(memory["full"]) if long["keep_full"] else long["full_bytes"] / 2 ** 20
    full_how = "measured" if long["keep_full"] else "computed"
    agreement = long["agreement"]
    short = agreement[agreement["seq_len"] == cfg.check_seq_len]
    entropy_diff = float(short.loc[short["score"] == "entropy", "abs_diff"].max())

    checks = pd.DataFrame([
        *cost["checks"],
        {"check": f"2: max |streaming - full-map entropy| at {cfg.check_seq_len} tokens (nats)",
         "value": entropy_diff},
        {"check": f"2: max |streaming - full-map score| at {cfg.check_seq_len} tokens, "
                  "entropy/entropy_norm/max_weight", "value": float(short["abs_diff"].max())},
        {"check": f"2: max |streaming - full-map score| at {cfg.llama_seq_len} tokens",
         "value": float(agreement.loc[agreement["seq_len"] == cfg.llama_seq_len,
                                      "abs_diff"].max()) if long["keep_full"] else float("nan")},
    ])
    summary = pd.DataFrame([
        {"benchmark": f"1. census / bare forward, {cfg.n_sentences} sentences (ratio of medians)",
         "ours": float(med[FULL]), "baseline": float(med[BARE]), "unit": "s",
         "ratio": float(med[FULL] / med[BARE]), "target": f"<= {cfg.speed_target:g}",
         "pass": bool(med[FULL] / med[BARE] <= cfg.speed_target)},
        {"benchmark": "1. census / bare forward (median of paired per-round ratios)",
         "ours": float("nan"), "baseline": float("nan"), "unit": "",
         "ratio": float(paired[FULL]), "target": f"<= {cfg.speed_target:g}",
         "pass": bool(paired[FULL] <= cfg.speed_target)},
        {"benchmark": f"2. streaming census reducers vs full maps ({full_how}), peak RSS, "
                      f"1x{cfg.llama_seq_len}",
         "ours": streaming_mib, "baseline": full_mib, "unit": "MiB above baseline",
         "ratio": streaming_mib / full_mib, "target": "(reported)", "pass": None},
        {"benchmark": f"2. streaming entropy == full-map entropy at {cfg.check_seq_len} tokens",
         "ours": entropy_diff, "baseline": cfg.entropy_tolerance, "unit": "nats (max |diff|)",
         "ratio": float("nan"), "target": f"<= {cfg.entropy_tolerance:g}",
         "pass": bool(entropy_diff <= cfg.entropy_tolerance)},
    ])
    return {"timing": timing, "timing_raw": cost["timing_raw"], "prep": cost["prep"],
            "batches": cost["batches"], "memory": long["memory"], "agreement": agreement,
            "checks": checks, "summary": summary, "source": source}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == CHILD_FLAG:  # hidden: one memory measurement in a fresh process
        print(json.dumps(_memory_measure(argv[1], Config.from_dict(json.loads(argv[2])))))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    out = analysis_main("bench_census", __doc__, Config, run, None, argv,
                        show=["prep", "timing", "memory", "checks", "summary"])
    summary = pd.read_csv(out / "summary.csv")
    speed, paired, memory = summary["ratio"].iloc[0], summary["ratio"].iloc[1], \
        summary["ratio"].iloc[2]
    print(f"\ncensus / bare forward: {speed:.2f}x (paired {paired:.2f}x; target "
          f"{summary['target'].iloc[0]})")
    print(f"streaming / full-map peak memory: {memory:.4f} ({summary['benchmark'].iloc[2]})")
    print(f"streaming vs full-map entropy: max |diff| = {summary['ours'].iloc[3]:.2e} nats")
    warning = load_warning(float(pd.read_csv(out / "timing_raw.csv")["foreign_load"].mean()))
    if warning:
        print(warning)


if __name__ == "__main__":
    main()

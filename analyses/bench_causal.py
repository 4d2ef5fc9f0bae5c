"""Benchmark: causal language models — capture during generation, and the census on long contexts.

Two measurements, each side by side in one run:

1. **Generation.** A tiny LLaMA and a tiny GPT-2 (``LlamaForCausalLM`` / ``GPT2LMHeadModel``
   from configs, random seeded weights, SDPA as built) generate ``new_tokens`` greedily from a
   ``prompt_len``-token prompt with the KV cache on. Contenders, interleaved (A, B, A, B, ...):
   plain ``model.generate(...)`` and the same call inside ``ap.capture(model)`` (every layer,
   maps kept). The timed region is the ``generate`` call (for the capture also entering and
   leaving the context); turning the kept weights into ``cap.maps`` happens on first access
   and is timed apart (``maps_s``). Both must produce the same tokens (checked on every
   model). Decoding one sequence is latency-bound, so it runs on ``threads`` CPU threads (with
   more OpenMP threads than free cores a one-token step waits on barriers; the shared 2-core CI
   machine made that the dominant cost). Headline: median capture / median plain, target
   ``<= gen_target``.

2. **Long contexts.** A tiny causal LLaMA (``LlamaModel``, SDPA, ``max_position_embeddings``
   large enough) reads one raw text of ``L`` tokens (random words, attnprobe's word tokenizer)
   for ``L`` in ``lengths`` (4,096 to 32,768). Each length runs in a fresh child process: the
   streaming census (``ap.heads.census(..., similarity=False)``; the repeated-token probe
   included; offsets beyond ±64 share one ``far`` bin, the census default), then a plain
   forward as the floor. Reported per length: census seconds, forward
   seconds, peak RSS above the pre-census baseline (``VmHWM`` after a reset, glibc's mmap
   threshold fixed so freed blocks are returned), the largest block of weights any census part
   received (``[batch, head, rows, key]`` float32 bytes), and the memory full maps would need
   (``layers x heads x L^2 x 4`` bytes). Target at the longest length: peak <= 1/50 of full
   maps. Time growth is the slope of log(seconds) on log(L) (least squares over the lengths).

Run: ``python analyses/bench_causal.py [--smoke] [--out DIR]``; tables and ``provenance.json``
go to ``runs/bench_causal/<UTC stamp>/``. The full run takes about ten minutes on 2 cores
(the census is quadratic in the context: five to six minutes at 32,768 tokens).
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from harness.benchmarking import (
    TIMED_S,
    FromDict,
    Outcome,
    interleaved,
    load_warning,
    run_json_child,
    timing_table,
)
from harness.runs import analysis_main, memory_status_kib, reset_peak_rss

import attnprobe as ap

CHILD_FLAG = "--_census-child"  # hidden: one long-context measurement in a fresh process
PLAIN = "generate"
CAPTURED = "capture(model) around generate"
MIB = 2.0**20


@dataclass
class Config(FromDict):
    """Sizes and targets (defaults: the full run)."""

    gen_models: tuple[str, ...] = ("llama", "gpt2")
    gen_hidden: int = 128
    gen_layers: int = 4
    gen_heads: int = 4
    gen_vocab: int = 1000
    prompt_len: int = 64
    new_tokens: int = 64
    threads: int = 1
    repeats: int = 7
    warmup: int = 2
    gen_target: float = 1.2
    lengths: tuple[int, ...] = (4096, 8192, 16384, 32768)
    llama_hidden: int = 64
    llama_layers: int = 2
    llama_heads: int = 4
    llama_intermediate: int = 128
    llama_init_range: float = 0.2  # larger than HF's 0.02 so heads are not near-uniform
    memory_target: float = 1 / 50  # peak / full maps at the longest length
    memory_subprocess: bool = True
    child_timeout_s: float = 4 * 3600.0
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        """Short generation, one repeat, contexts of 64 and 128 tokens measured in-process."""
        return cls(prompt_len=16, new_tokens=8, repeats=1, warmup=0, lengths=(64, 128),
                   memory_subprocess=False)


# ----------------------------------------------------------------------------- 1: generation
def _causal_lm(name: str, cfg: Config) -> torch.nn.Module:
    import transformers

    torch.manual_seed(cfg.seed)
    if name == "llama":
        config = transformers.LlamaConfig(
            vocab_size=cfg.gen_vocab, hidden_size=cfg.gen_hidden,
            intermediate_size=2 * cfg.gen_hidden, num_hidden_layers=cfg.gen_layers,
            num_attention_heads=cfg.gen_heads, num_key_value_heads=cfg.gen_heads // 2,
            max_position_embeddings=cfg.prompt_len + cfg.new_tokens + 8,
            initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return transformers.LlamaForCausalLM(config).eval()
    if name == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=cfg.gen_vocab, n_embd=cfg.gen_hidden, n_layer=cfg.gen_layers,
            n_head=cfg.gen_heads, n_positions=cfg.prompt_len + cfg.new_tokens + 8,
            initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return transformers.GPT2LMHeadModel(config).eval()
    raise ValueError(f"unknown generation model {name!r}; use llama or gpt2")


def _generation(cfg: Config) -> dict[str, Any]:
    raws, checks = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        for name in cfg.gen_models:
            model = _causal_lm(name, cfg)
            prompt = torch.randint(3, cfg.gen_vocab, (1, cfg.prompt_len),
                                   generator=torch.Generator().manual_seed(cfg.seed + 1))
            options = dict(max_new_tokens=cfg.new_tokens, min_new_tokens=cfg.new_tokens,
                           do_sample=False, use_cache=True, pad_token_id=0)

            def plain(model=model, prompt=prompt, options=options) -> Outcome:
                return Outcome({}, model.generate(prompt, **options))

            def captured(model=model, prompt=prompt, options=options) -> Outcome:
                start = time.perf_counter()
                with ap.capture(model) as cap:
                    tokens = model.generate(prompt, **options)
                seconds = time.perf_counter() - start
                start = time.perf_counter()
                maps = cap.maps
                extras = {TIMED_S: seconds, "maps_s": time.perf_counter() - start,
                          "maps": len(maps), "map_keys": maps[0].pattern.shape[-1]}
                return Outcome(extras, tokens)

            results: dict[str, Any] = {}
            with torch.no_grad():
                raw = interleaved({PLAIN: plain, CAPTURED: captured}, repeats=cfg.repeats,
                                  warmup=cfg.warmup, labels={"model": name}, results=results)
            raws.append(raw)
            same = torch.equal(results[PLAIN], results[CAPTURED])
            if not same:
                raise AssertionError(f"{name}: capture changed the generated tokens")
            row = raw[raw["contender"] == CAPTURED].iloc[-1]
            checks += [{"check": f"1: {name}: captured generation == plain generation",
                        "value": float(same)},
                       {"check": f"1: {name}: maps after capture / keys in the first map",
                        "value": f"{int(row['maps'])} / {int(row['map_keys'])}"}]
    finally:
        torch.set_num_threads(threads)
    raw = pd.concat(raws, ignore_index=True)
    tables = [timing_table(raw[raw["model"] == name], PLAIN, medians=["maps_s"])
              .assign(model=name) for name in cfg.gen_models]
    timing = pd.concat(tables, ignore_index=True)
    return {"timing": timing[["model", *timing.columns[:-1]]], "raw": raw, "checks": checks}


# ----------------------------------------------------------------------------- 2: long contexts
def _census_setup(cfg: Config, length: int) -> tuple[torch.nn.Module, Any, str]:
    import transformers

    from attnprobe.models.tokenizer import WordTokenizer

    tok = WordTokenizer(model_max_length=length + 8)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=cfg.llama_hidden,
        intermediate_size=cfg.llama_intermediate, num_hidden_layers=cfg.llama_layers,
        num_attention_heads=cfg.llama_heads, num_key_value_heads=cfg.llama_heads,
        max_position_embeddings=length + 8, initializer_range=cfg.llama_init_range,
        pad_token_id=0, bos_token_id=2, eos_token_id=1)
    torch.manual_seed(cfg.seed)
    model = transformers.LlamaModel(config).eval()
    words = tok.ids_to_tokens[3 + 11:]  # no specials, no punctuation
    draw = torch.randint(0, len(words), (length - 1,),
                         generator=torch.Generator().manual_seed(cfg.seed + length))
    return model, tok, " ".join(words[i] for i in draw.tolist())  # + [BOS]: length tokens


def _trim_heap() -> None:
    """Hand freed heap memory back to the OS (glibc), so later allocations show in RSS."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _census_measure(length: int, cfg: Config) -> dict[str, Any]:
    """One streaming census of ``length`` tokens and one plain forward (this process)."""
    from attnprobe.capture.parts import Reduce
    from attnprobe.heads.census_tap import CensusTap

    model, tok, text = _census_setup(cfg, length)
    largest = [0]
    readers = (CensusTap, Reduce)  # the corpus' part and the probe's
    on_rows = {reader: reader.on_rows for reader in readers}

    def measured(reader: type) -> Any:
        def on_rows_measured(self: Any, recorder: Any, rows: Any) -> None:
            largest[0] = max(largest[0], rows.pattern.numel() * 4)  # the blocks held
            on_rows[reader](self, recorder, rows)
        return on_rows_measured

    for reader in readers:
        reader.on_rows = measured(reader)
    try:
        with torch.no_grad():
            ap.heads.census(model, tok, [text[:200]], similarity=False)  # lazy set-up
            largest[0] = 0
            _trim_heap()
            baseline = memory_status_kib()["VmRSS"]
            reset = reset_peak_rss()
            start = time.perf_counter()
            result = ap.heads.census(model, tok, [text], similarity=False)
            seconds = time.perf_counter() - start
            peak = memory_status_kib()["VmHWM"]
            scores = result.scores()
            ids = tok([text])["input_ids"]
            start = time.perf_counter()
            model(input_ids=ids)
            forward = time.perf_counter() - start
    finally:
        for reader in readers:
            reader.on_rows = on_rows[reader]
    return {"length": int(ids.shape[1]), "census_s": seconds, "forward_s": forward,
            "baseline_kib": baseline, "peak_kib": peak, "hwm_reset_works": reset,
            "largest_block_bytes": largest[0], "heads_scored": len(scores),
            "entropy_mean": float(scores["entropy"].mean())}


def _run_census(length: int, cfg: Config) -> dict[str, Any]:
    if not cfg.memory_subprocess:
        _trim_heap()
        return _census_measure(length, cfg)
    return run_json_child([str(Path(__file__).resolve()), CHILD_FLAG, str(length),
                           json.dumps(asdict(cfg))],
                          timeout_s=cfg.child_timeout_s, what=f"census child ({length})")


def _slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of log(y) on log(x) (NaN with fewer than two points)."""
    if len(x) < 2:
        return float("nan")
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / \
        sum((a - mx) ** 2 for a in lx)


def _long_contexts(cfg: Config) -> pd.DataFrame:
    rows = []
    for length in cfg.lengths:
        r = _run_census(length, cfg)
        full = cfg.llama_layers * cfg.llama_heads * r["length"] ** 2 * 4
        peak = (r["peak_kib"] - r["baseline_kib"]) * 1024
        rows.append({"length": r["length"], "census_s": r["census_s"],
                     "forward_s": r["forward_s"], "census_over_forward":
                     r["census_s"] / r["forward_s"], "peak_above_baseline_mib": peak / MIB,
                     "largest_block_mib": r["largest_block_bytes"] / MIB,
                     "full_maps_mib": full / MIB, "peak_over_full_maps": peak / full,
                     "heads_scored": r["heads_scored"], "entropy_mean": r["entropy_mean"],
                     "method": "VmHWM after reset" if r["hwm_reset_works"]
                     else "VmHWM (reset failed: includes earlier peaks)",
                     "process": "fresh child" if cfg.memory_subprocess else "this process"})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- run
def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Both benchmarks; returns the tables (nothing is printed)."""
    generation = _generation(cfg)
    gc.collect()
    long = _long_contexts(cfg)
    timing = generation["timing"].set_index(["model", "contender"])
    lengths, census_s = long["length"].tolist(), long["census_s"].tolist()
    census_slope = _slope(lengths, census_s)
    forward_slope = _slope(lengths, long["forward_s"].tolist())
    last = long.iloc[-1]
    load = float(generation["raw"]["foreign_load"].mean())
    summary = [{"benchmark": f"1. capture during generate / plain generate, {name} "
                             f"({cfg.prompt_len} + {cfg.new_tokens} tokens, KV cache)",
                "ours": float(timing.loc[(name, CAPTURED), "median_s"]),
                "baseline": float(timing.loc[(name, PLAIN), "median_s"]), "unit": "s",
                "ratio": float(timing.loc[(name, CAPTURED), "ratio_to_baseline"]),
                "target": f"<= {cfg.gen_target:g}",
                "pass": bool(timing.loc[(name, CAPTURED), "ratio_to_baseline"]
                             <= cfg.gen_target)} for name in cfg.gen_models]
    summary += [
        {"benchmark": f"2. streaming census peak memory / full maps at {int(last['length'])} "
                      "tokens", "ours": float(last["peak_above_baseline_mib"]),
         "baseline": float(last["full_maps_mib"]), "unit": "MiB",
         "ratio": float(last["peak_over_full_maps"]), "target": f"<= {cfg.memory_target:.3g}",
         "pass": bool(last["peak_over_full_maps"] <= cfg.memory_target)},
        {"benchmark": "2. census time ~ L^k: k (log-log slope over the lengths)",
         "ours": census_slope, "baseline": forward_slope, "unit": "k (baseline: plain forward)",
         "ratio": float("nan"), "target": "(reported)", "pass": None},
    ]
    checks = pd.DataFrame([
        *generation["checks"],
        {"check": "1: mean CPU load of other processes during timing (cores)", "value": load},
        {"check": "2: largest block of weights held at once (MiB), any length",
         "value": float(long["largest_block_mib"].max())},
        {"check": "2: heads scored at every length", "value": ", ".join(
            str(n) for n in long["heads_scored"])},
    ])
    return {"generation": generation["timing"], "generation_raw": generation["raw"],
            "long_context": long, "checks": checks, "summary": pd.DataFrame(summary)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == CHILD_FLAG:  # hidden: one measurement in a fresh process
        print(json.dumps(_census_measure(int(argv[1]), Config.from_dict(json.loads(argv[2])))))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    out = analysis_main("bench_causal", __doc__, Config, run, None, argv,
                        show=["generation", "long_context", "checks", "summary"])
    summary = pd.read_csv(out / "summary.csv")
    for row in summary.itertuples():
        print(f"{row.benchmark}: {row.ratio:.4g} (target {row.target})" if row.ratio == row.ratio
              else f"{row.benchmark}: k = {row.ours:.2f} (plain forward {row.baseline:.2f})")
    warning = load_warning(float(pd.read_csv(out / "generation_raw.csv")["foreign_load"].mean()))
    if warning:
        print(warning)


if __name__ == "__main__":
    main()

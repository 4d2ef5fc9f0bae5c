"""Benchmark: what ``attnprobe.capture`` costs next to the model's own ways of getting attention.

Three comparisons, each measured side by side in one run:

1. MiniLM, batch ``batch_size x seq_len``: capture of every layer (``capture(model)``, keep=True,
   on the default SDPA model) vs the eager-loaded twin with ``output_attentions=True``.
2. The same batch: capture of one layer (``layers=[one_layer]``) vs the plain SDPA forward.
3. A tiny causal LLaMA (SDPA default), batch ``1 x llama_seq_len``: per-head entropy from
   streaming reducers (``keep=False, reducers=[Entropy()]``) vs full capture followed by
   entropy from the maps. Peak memory above a pre-forward baseline is read in a fresh
   subprocess per contender (VmHWM after resetting it through ``/proc/self/clear_refs``,
   cross-checked by a thread sampling VmRSS). A third child runs the plain SDPA forward with
   no capture, as the floor both contenders stand on (not part of the ratio).

Timings are medians of ``repeats`` timed runs after ``warmup`` untimed ones, under
``torch.no_grad()``, with the contenders interleaved (A, B, A, B, ...) so drift hits both.
For capture the timed region is entering the context, the forward and leaving it: the weights
are then recorded, as eager's ``output_attentions`` returns them. Cutting them into padding-free
per-example ``cap.maps`` happens on first access; it is timed separately (``maps_s``) and an
end-to-end row (capture + maps) is reported next to the headline.

Run: ``python analyses/bench_capture.py [--smoke] [--repeats N] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from harness.benchmarking import (
    TIMED_S,
    Contender,
    FromDict,
    Outcome,
    interleaved,
    load_warning,
    ratios,
    run_json_child,
    timing_table,
    with_result,
)
from harness.runs import (
    memory_status_kib,
    print_tables,
    provenance,
    reset_peak_rss,
    run_dir,
    write_run,
)

import attnprobe
from attnprobe.heads import Entropy

CHILD_FLAG = "--_memory-child"  # hidden: run one memory measurement and print JSON
MODES = ("streaming", "full", "plain")  # plain: the SDPA forward alone, for reference
MIB = 1024.0  # KiB per MiB


@dataclass
class Config(FromDict):
    """Sizes and targets of the benchmark (defaults: the full run)."""

    model: str = "minilm"
    batch_size: int = 32
    seq_len: int = 128
    one_layer: int = 3
    repeats: int = 7
    warmup: int = 2
    llama_hidden: int = 64
    llama_layers: int = 2
    llama_heads: int = 4
    llama_kv_heads: int = 2
    llama_intermediate: int = 128
    llama_vocab: int = 1000
    llama_init_range: float = 0.2  # larger than HF's 0.02 so heads are not near-uniform
    llama_seq_len: int = 8192
    query_block: int | None = None  # None: the library default (512 rows)
    entropy_chunk: int = 256  # query rows per float64 chunk when computing entropy from full maps
    sample_ms: float = 5.0
    child_timeout_s: float = 600.0
    speed_target: float = 1.10
    memory_target: float = 0.10
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        """Tiny sizes: checks the script end to end in seconds (numbers are meaningless)."""
        return cls(batch_size=2, seq_len=16, repeats=2, warmup=1, llama_seq_len=1024)


# ----------------------------------------------------------------------------- inputs / models
def _minilm_batch(tokenizer: Any, cfg: Config) -> dict[str, torch.Tensor]:
    """Random non-special token ids, ``[CLS] ... [SEP]``, every position a real token."""
    gen = torch.Generator().manual_seed(cfg.seed)
    low = 999 if tokenizer.vocab_size > 2000 else max(tokenizer.all_special_ids) + 1
    ids = torch.randint(low, tokenizer.vocab_size, (cfg.batch_size, cfg.seq_len), generator=gen)
    ids[:, 0] = tokenizer.cls_token_id
    ids[:, -1] = tokenizer.sep_token_id
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _tiny_llama(cfg: Config) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        hidden_size=cfg.llama_hidden, num_hidden_layers=cfg.llama_layers,
        num_attention_heads=cfg.llama_heads, num_key_value_heads=cfg.llama_kv_heads,
        intermediate_size=cfg.llama_intermediate, vocab_size=cfg.llama_vocab,
        max_position_embeddings=max(8192, cfg.llama_seq_len),
        initializer_range=cfg.llama_init_range)
    torch.manual_seed(cfg.seed)
    return LlamaModel(config).eval()


def _llama_inputs(cfg: Config, length: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    ids = torch.randint(0, cfg.llama_vocab, (1, length), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


# ----------------------------------------------------------------------------- timing
def _interleaved(bench: str, contenders: dict[str, Contender], cfg: Config) -> pd.DataFrame:
    """Run the contenders alternately; one row per timed repeat and contender."""
    return interleaved(contenders, repeats=cfg.repeats, warmup=cfg.warmup,
                       labels={"benchmark": bench})


def _captured(model: torch.nn.Module, batch: dict, **kwargs: Any) -> Contender:
    def go() -> Outcome:
        t0 = time.perf_counter()
        with attnprobe.capture(model, **kwargs) as cap:
            model(**batch)
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        n_maps = len(cap.maps)  # assembled on first access
        t3 = time.perf_counter()
        return Outcome({TIMED_S: t2 - t0, "forward_s": t1 - t0, "exit_s": t2 - t1,
                        "maps_s": t3 - t2, "n_maps": n_maps}, cap)
    return go


def _plain(model: torch.nn.Module, batch: dict, **kwargs: Any) -> Contender:
    return with_result(lambda: model(**batch, **kwargs))


def _ratio_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Per benchmark: ratio of medians (the headline), median of per-repeat paired ratios
    (ours_i / baseline_i of the same interleaved round; robust to slow drift), ratio of mins."""
    rows = []
    for bench, sub in raw.groupby("benchmark", sort=False):
        ours_name, base_name = sub["contender"].unique()[:2]
        rows.append({"benchmark": bench, **ratios(sub, ours_name, base_name)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- memory (child)
class _Sampler:
    """Background thread: highest VmRSS seen, read every ``interval_s``."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.peak = memory_status_kib()["VmRSS"]
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, memory_status_kib()["VmRSS"])
            self.samples += 1
            self._stop.wait(self.interval_s)

    def start(self) -> _Sampler:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _entropy_from_maps(maps: list, chunk: int) -> torch.Tensor:
    """Mean row entropy (nats) per ``[layer, head]`` over all maps, float64 in row chunks."""
    total, rows = None, 0
    for amap in maps:
        p = amap.pattern  # [layer, head, query, key]
        sums = torch.zeros(p.shape[:2], dtype=torch.float64)
        for start in range(0, p.shape[2], chunk):
            a = p[:, :, start:start + chunk].to(torch.float64)
            sums -= torch.special.xlogy(a, a).sum(dim=(-1, -2))
            del a
        total = sums if total is None else total + sums
        rows += p.shape[2]
    return total / rows


def _entropy_from_tally(tally: Any, n_layers: int, n_heads: int) -> torch.Tensor:
    frame = tally.summary()
    out = torch.full((n_layers, n_heads), float("nan"), dtype=torch.float64)
    for layer, head, value in frame[["layer", "head", "entropy"]].itertuples(index=False):
        out[int(layer), int(head)] = float(value)
    return out


def _memory_child(mode: str, cfg: Config) -> dict[str, Any]:
    """Build model + inputs, take a baseline, run one captured forward, report peaks in KiB."""
    model = _tiny_llama(cfg)
    inputs = _llama_inputs(cfg, cfg.llama_seq_len)
    short = _llama_inputs(cfg, min(64, cfg.llama_seq_len))

    def forward(batch: dict) -> tuple[torch.Tensor, dict[str, int]]:
        marks: dict[str, int] = {}
        if mode == "streaming":
            with attnprobe.capture(model, keep=False, reducers=[Entropy()],
                                   query_block=cfg.query_block) as cap:
                model(**batch)
                marks["forward"] = memory_status_kib()["VmHWM"]
            marks["exit"] = memory_status_kib()["VmHWM"]
            entropy = _entropy_from_tally(cap.tally, cfg.llama_layers, cfg.llama_heads)
        elif mode == "full":
            with attnprobe.capture(model) as cap:
                model(**batch)
                marks["forward"] = memory_status_kib()["VmHWM"]
            marks["exit"] = memory_status_kib()["VmHWM"]
            entropy = _entropy_from_maps(cap.maps, cfg.entropy_chunk)
        else:
            cap = model(**batch)
            marks["forward"] = marks["exit"] = memory_status_kib()["VmHWM"]
            entropy = torch.full((cfg.llama_layers, cfg.llama_heads), float("nan"))
        del cap
        return entropy, marks

    with torch.no_grad():
        forward(short)  # one-time lazy initialisation (kernels, thread pools) is not counted
        gc.collect()
        baseline = memory_status_kib()["VmRSS"]
        ru_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        hwm_reset = reset_peak_rss()
        sampler = _Sampler(cfg.sample_ms / 1000.0).start()
        start = time.perf_counter()
        entropy, marks = forward(inputs)
        seconds = time.perf_counter() - start
        hwm_end = memory_status_kib()["VmHWM"]
        sampled = sampler.stop()
    ru_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "mode": mode,
        "attn_implementation": model.config._attn_implementation,
        "seq_len": cfg.llama_seq_len,
        "seconds": seconds,
        "baseline_rss_kib": baseline,
        "hwm_reset_works": hwm_reset,
        "hwm_forward_kib": marks["forward"],
        "hwm_exit_kib": marks["exit"],
        "hwm_end_kib": hwm_end,
        "sampled_peak_kib": sampled,
        "samples": sampler.samples,
        "ru_maxrss_before_kib": ru_before,
        "ru_maxrss_after_kib": ru_after,
        "entropy": entropy.tolist(),
    }


def _run_child(mode: str, cfg: Config) -> dict[str, Any]:
    return run_json_child([str(Path(__file__).resolve()), CHILD_FLAG, mode,
                           json.dumps(asdict(cfg))],
                          timeout_s=cfg.child_timeout_s, what=f"memory child ({mode})")


def _memory_tables(results: dict[str, dict]) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    rows = []
    for mode, r in results.items():
        base = r["baseline_rss_kib"]
        reset = r["hwm_reset_works"]
        hwm_peak = (r["hwm_end_kib"] - base) / MIB if reset else float("nan")
        sampled = (r["sampled_peak_kib"] - base) / MIB
        rows.append({
            "mode": mode,
            "attn_implementation": r["attn_implementation"],
            "seq_len": r["seq_len"],
            "seconds": r["seconds"],
            "baseline_rss_mib": base / MIB,
            "peak_above_baseline_mib": hwm_peak if reset else sampled,
            "method": "VmHWM (reset via clear_refs)" if reset else "VmRSS sampler",
            "hwm_forward_above_mib": (r["hwm_forward_kib"] - base) / MIB if reset else float("nan"),
            "hwm_exit_above_mib": (r["hwm_exit_kib"] - base) / MIB if reset else float("nan"),
            "sampler_peak_above_mib": sampled,
            "sampler_samples": r["samples"],
            # ru_maxrss survives fork + execve on Linux, so it starts at the parent's RSS at
            # spawn time; it only says something here when it grew during the measurement.
            "ru_maxrss_above_mib": (r["ru_maxrss_after_kib"] - base) / MIB,
            "ru_maxrss_grew": r["ru_maxrss_after_kib"] > r["ru_maxrss_before_kib"],
        })
    memory = pd.DataFrame(rows)
    ent = {m: torch.tensor(results[m]["entropy"], dtype=torch.float64)
           for m in ("streaming", "full")}
    ent_rows = []
    n_layers, n_heads = ent["streaming"].shape
    for layer in range(n_layers):
        for head in range(n_heads):
            s, f = float(ent["streaming"][layer, head]), float(ent["full"][layer, head])
            ent_rows.append({"layer": layer, "head": head,
                             "head_id": attnprobe.head_id(layer, head),
                             "streaming_nats": s, "full_nats": f, "abs_diff": abs(s - f)})
    entropy = pd.DataFrame(ent_rows)
    return memory, entropy, float(entropy["abs_diff"].max())


# ----------------------------------------------------------------------------- run
def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Run all three benchmarks; return the tables (nothing is printed)."""
    model, tokenizer = attnprobe.load_model(cfg.model)
    eager, _ = attnprobe.load_model(cfg.model, attn_implementation="eager")
    batch = _minilm_batch(tokenizer, cfg)
    b1 = f"1. all layers vs eager output_attentions ({cfg.batch_size}x{cfg.seq_len})"
    b2 = f"2. layer {cfg.one_layer} vs plain SDPA ({cfg.batch_size}x{cfg.seq_len})"
    b3 = f"3. streaming entropy vs full capture, peak memory (1x{cfg.llama_seq_len})"

    checks = []
    with torch.no_grad():
        raw = _interleaved(b1, {
            "capture(all layers, keep)": _captured(model, batch),
            "eager + output_attentions": _plain(eager, batch, output_attentions=True),
        }, cfg)
        raw_b2 = _interleaved(b2, {
            f"capture(layers=[{cfg.one_layer}], keep)": _captured(model, batch,
                                                                 layers=[cfg.one_layer]),
            "plain SDPA forward": _plain(model, batch),
        }, cfg)

        # correctness of what was timed (untimed)
        reference = eager(**batch, output_attentions=True)
        ref_maps = torch.stack(reference.attentions, dim=1)  # [batch, layer, head, q, k]
        with attnprobe.capture(model) as cap:
            model(**batch)
        ours = torch.stack([m.pattern for m in cap.maps])
        checks.append({"check": "1: max |capture maps - eager attentions|",
                       "value": float((ours - ref_maps).abs().max())})
        plain = model(**batch).last_hidden_state
        with attnprobe.capture(model, layers=[cfg.one_layer]) as cap:
            hidden = model(**batch).last_hidden_state
        one = torch.stack([m.pattern[0] for m in cap.maps])
        checks.append({"check": f"2: max |layer {cfg.one_layer} map - eager attention|",
                       "value": float((one - ref_maps[:, cfg.one_layer]).abs().max())})
        checks.append({"check": "2: max |hidden under capture - plain SDPA hidden|",
                       "value": float((hidden - plain).abs().max())})
        del reference, ref_maps, cap, ours, one, plain, hidden
    del model, eager
    gc.collect()

    raw_frame = pd.concat([raw, raw_b2], ignore_index=True)
    timing = timing_table(raw_frame, by=["benchmark", "contender"],
                          medians=["forward_s", "exit_s", "maps_s"])
    checks.append({"check": "timing: mean CPU load of other processes (cores)",
                   "value": float(raw_frame["foreign_load"].mean())})

    results = {mode: _run_child(mode, cfg) for mode in MODES}
    memory, entropy, max_diff = _memory_tables(results)
    checks.append({"check": "3: max |streaming entropy - full entropy| (nats)", "value": max_diff})
    checks.append({"check": "3: VmHWM reset via /proc/self/clear_refs works",
                   "value": float(all(r["hwm_reset_works"] for r in results.values()))})

    def med(bench: str, contender_index: int) -> float:
        sub = timing[timing["benchmark"] == bench]
        return float(sub["median_s"].iloc[contender_index])

    def maps_med(bench: str) -> float:
        return float(timing[timing["benchmark"] == bench]["median_maps_s"].iloc[0])

    mem = memory.set_index("mode")["peak_above_baseline_mib"]
    summary_rows = [
        (b1, med(b1, 0), med(b1, 1), "s", cfg.speed_target),
        (b1 + " + per-example maps", med(b1, 0) + maps_med(b1), med(b1, 1), "s", float("nan")),
        (b2, med(b2, 0), med(b2, 1), "s", cfg.speed_target),
        (b3, float(mem["streaming"]), float(mem["full"]), "MiB", cfg.memory_target),
    ]
    summary = pd.DataFrame([
        {"benchmark": name, "ours": ours_v, "baseline": base_v, "unit": unit,
         "ratio": ours_v / base_v,
         "target": f"<= {target:.2f}" if target == target else "(reported)",
         "pass": ours_v / base_v <= target if target == target else None}
        for name, ours_v, base_v, unit, target in summary_rows])

    return {"timing": timing, "timing_raw": raw_frame, "ratios": _ratio_table(raw_frame),
            "memory": memory, "entropy": entropy, "checks": pd.DataFrame(checks),
            "summary": summary}


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == CHILD_FLAG:  # hidden: one memory measurement in a fresh process
        result = _memory_child(argv[1], Config.from_dict(json.loads(argv[2])))
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, quick end-to-end check")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 7)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default runs/bench_capture/<UTC timestamp>/)")
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cfg = Config.smoke() if args.smoke else Config()
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error("--repeats must be positive")
        cfg.repeats = args.repeats
    out = run_dir("bench_capture", args.out)
    start = time.perf_counter()
    tables = run(cfg)
    wall = time.perf_counter() - start
    print_tables(tables, ["timing", "ratios", "memory", "entropy", "checks", "summary"])
    warning = load_warning(float(tables["timing_raw"]["foreign_load"].mean()))
    if warning:
        print(f"\n{warning}")
    write_run(out, tables, provenance("analyses/bench_capture.py", cfg, wall))
    print(f"\nwall time {wall:.1f} s; tables written to {out}/")


if __name__ == "__main__":
    main()

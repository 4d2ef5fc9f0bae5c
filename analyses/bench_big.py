"""Benchmark: capture, census, patching and DLA on a model larger than the memory allowed, against
a plain forward with the same offloading — time and peak memory, side by side in one run.

**The model.** A random LLaMA-layout decoder (``shape``: hidden 2048, 22 layers of 16 heads,
MLP 8192, untied unembedding; vocabulary = the packaged MiniLM tokenizer's 30,522 tokens): 1.6 B
parameters, 3.2 GB in bf16. It is written to ``cache_dir`` one safetensors shard at a time
(:func:`harness.big_llama.write_random_llama`: at most one layer's tensors in memory, seeded)
and reused by later runs.

**Loading.** ``ap.load_model(folder, dtype="bf16", max_memory="cpu=<cpu_cap>",
offload_folder=...)``: accelerate keeps the first modules in RAM up to the cap and offloads the
rest to disk; their weights are read back one module at a time during each forward by the
offload hooks. The cap (1 GiB) is below the model's size, so it cannot fit; the run checks that
modules were offloaded.

**Steps** (:data:`STEPS`), each on the same ``clean`` text (17 tokens) or the
``clean``/``corrupt`` pair of equal length:

- ``plain forward`` (the baseline): ``model(input_ids, attention_mask)`` under ``no_grad``;
- ``capture``: ``ap.extract`` of every layer and head;
- ``census``: ``ap.heads.census`` of both texts in one batch, without its repeated-token
  probe (``repeated=False``: the probe is a second forward over 4 × 66 synthetic tokens, a
  separate analysis whose cost is that of its own tokens, not of the census);
- ``patch.heads``: ``ap.patch.heads(model, tok, clean, corrupt, "next-token",
  scope=patch_scope)`` (the last layer by default: each patched forward replays the layers
  before the patch, so the cost of a wider scope is that of more layer-rows, not a new
  mechanism);
- ``logit_attribution``: ``ap.heads.logit_attribution`` (``next-token``), which reads W_O of
  every head and the unembedding from wherever they live.

**Memory.** Each step runs in a fresh process (``subprocess``), so no peak of another step or
of its heap hides in it: the process loads the model, runs one untimed plain forward (so lazy
initialisation and the first read of every offloaded weight are not charged to the step),
resets ``VmHWM`` (``/proc/self/clear_refs``), then runs the step once, timed. Reported:

- ``peak_rss_mib``: ``VmHWM`` over the step — every resident page, *file-backed ones
  included*: safetensors shards and accelerate's offloaded weights are read through
  ``mmap``, and the page cache pages a process touches count in its RSS while they stay
  mapped although the kernel can drop them at any time (they are not the process's memory);
- ``peak_rss_anon_mib``: the peak of ``RssAnon`` (the process's own memory: tensors, heap),
  sampled every 5 ms by a thread (:class:`harness.big_llama.PeakSampler`; the kernel keeps
  no peak for it), the figure to hold against the cap;
- ``load_peak_rss_mib``: ``VmHWM`` of loading the model (before the reset).

``extra_anon_over_forward_mib`` is what a step keeps beyond the plain forward (its peak
``RssAnon`` minus the baseline's). ``--smoke`` builds a ~9 M-parameter model and measures
in one process (peaks then mix; the smoke run checks that everything runs, not the figures).

Run: ``python analyses/bench_big.py [--smoke] [--out DIR]`` (the full run takes minutes;
building the checkpoint once, about a minute more).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from harness.benchmarking import FromDict, run_json_child
from harness.big_llama import LlamaShape, PeakSampler, status_kib, write_random_llama
from harness.runs import reset_peak_rss

import attnprobe as ap
from attnprobe.core.residence import execution_device
from attnprobe.load_options import parse_size

CHILD_FLAG = "--_step-child"  # hidden: one step in a fresh process, prints JSON
KIB_PER_MIB = 1024.0
BASELINE = "plain forward"
CLEAN = "The capital of France is Paris, and it is famous for its museums."
CORRUPT = "The capital of Italy is Rome, and it is famous for its churches."


@dataclass
class Config(FromDict):
    """Model shape, memory cap and inputs (defaults: the full run)."""

    shape: dict[str, Any] = field(default_factory=lambda: asdict(LlamaShape(
        hidden=2048, layers=22, heads=16, kv_heads=16, intermediate=8192)))
    cache_dir: str = "~/.cache/attnprobe/bench_big"
    dtype: str = "bf16"
    cpu_cap: str = "1GiB"
    clean: str = CLEAN
    corrupt: str = CORRUPT
    patch_scope: str = ""  # "" = the last layer
    threads: int = 1
    seed: int = 0
    subprocess: bool = True
    child_timeout_s: float = 1800.0

    @classmethod
    def smoke(cls) -> Config:
        """A ~9 M-parameter model in a temporary cache, offloaded below an 8 MiB cap, measured
        in this process."""
        return cls(shape=asdict(LlamaShape(hidden=64, layers=4, heads=4, kv_heads=4,
                                           intermediate=1024)),
                   cache_dir="", cpu_cap="8MiB", subprocess=False)

    def llama(self) -> LlamaShape:
        return LlamaShape(**self.shape)

    def folder(self) -> Path:
        """Where the checkpoint lives (no ``cache_dir``: under the temporary folder)."""
        if self.cache_dir:
            return Path(self.cache_dir).expanduser() / _name(self.llama(), self.dtype, self.seed)
        import tempfile

        return Path(tempfile.gettempdir()) / "attnprobe_bench_big" / _name(
            self.llama(), self.dtype, self.seed)

    def scope(self) -> str:
        return self.patch_scope or f"layer:{self.llama().layers - 1}"


def _name(shape: LlamaShape, dtype: str, seed: int) -> str:
    return (f"llama_h{shape.hidden}_l{shape.layers}_a{shape.heads}_kv{shape.kv_heads}"
            f"_i{shape.intermediate}_{dtype}_s{seed}")


def _dtype(name: str) -> torch.dtype:
    from attnprobe.load_options import DTYPES

    return DTYPES[name]


# ----------------------------------------------------------------------------- steps
Step = Callable[[Any, Any, Config], dict[str, float]]


def _inputs(model: Any, tokenizer: Any, text: str) -> dict[str, torch.Tensor]:
    encoded = tokenizer([text], return_tensors="pt")
    device = execution_device(model)
    return {"input_ids": encoded["input_ids"].to(device),
            "attention_mask": encoded["attention_mask"].to(device)}


def plain_forward(model: Any, tokenizer: Any, cfg: Config) -> dict[str, float]:
    inputs = _inputs(model, tokenizer, cfg.clean)
    with torch.no_grad():
        logits = model(**inputs).logits
    return {"tokens": float(inputs["input_ids"].shape[1]),
            "finite logits (1 = yes)": float(torch.isfinite(logits).all())}


def capture(model: Any, tokenizer: Any, cfg: Config) -> dict[str, float]:
    (amap,) = ap.extract(model, tokenizer, [cfg.clean])
    rows = amap.pattern.double().sum(-1)
    return {"layers x heads captured": float(amap.pattern.shape[0] * amap.pattern.shape[1]),
            "max |row sum - 1|": float((rows - 1).abs().max())}


def census(model: Any, tokenizer: Any, cfg: Config) -> dict[str, float]:
    result = ap.heads.census(model, tokenizer, [cfg.clean, cfg.corrupt], repeated=False)
    scores = result.scores()
    return {"heads scored": float(len(scores)),
            "finite entropies (1 = yes)": float(scores["entropy"].notna().all()
                                                and (scores["entropy"] >= 0).all())}


def patch_heads(model: Any, tokenizer: Any, cfg: Config) -> dict[str, float]:
    table = ap.patch.heads(model, tokenizer, cfg.clean, cfg.corrupt, "next-token",
                           scope=cfg.scope())
    return {"patched heads (table rows)": float(len(table)),
            "finite effects (1 = yes)": float(table["effect"].notna().all())}


def logit_attribution(model: Any, tokenizer: Any, cfg: Config) -> dict[str, float]:
    found = ap.heads.logit_attribution(model, tokenizer, [cfg.clean], "next-token")
    totals = found.totals
    return {"head rows": float((found.table["kind"] == "head").sum()),
            "max |components - value| / |value|": float(
                (totals["gap"].abs() / totals["value"].abs()).max())}


STEPS: dict[str, Step] = {
    BASELINE: plain_forward,
    "capture (ap.extract)": capture,
    "census": census,
    "patch.heads": patch_heads,
    "logit_attribution": logit_attribution,
}


# ----------------------------------------------------------------------------- one step
def _load(cfg: Config) -> tuple[Any, Any, float]:
    start = time.perf_counter()
    with warnings.catch_warnings():
        # the MiniLM tokenizer only supplies the vocabulary of a random model: its BERT
        # template on a causal LM is intended here, not the mistake load_model warns about
        warnings.filterwarnings("ignore", message=".*wraps every text in")
        model, tokenizer = ap.load_model(str(cfg.folder()), dtype=cfg.dtype,
                                         max_memory=f"cpu={cfg.cpu_cap}",
                                         offload_folder=str(cfg.folder().parent / "offload"))
    return model, tokenizer, time.perf_counter() - start


def measure(name: str, cfg: Config, loaded: tuple[Any, Any, float] | None = None
            ) -> dict[str, Any]:
    """Load (unless ``loaded``), warm up with one plain forward, reset the peak, run step
    ``name`` once: its seconds, memory (KiB) and checks."""
    torch.set_num_threads(cfg.threads)
    model, tokenizer, load_s = loaded or _load(cfg)
    load_peak = status_kib()["VmHWM"]
    plain_forward(model, tokenizer, cfg)
    reset = reset_peak_rss()
    with PeakSampler() as sampler:
        start = time.perf_counter()
        checks = STEPS[name](model, tokenizer, cfg)
        seconds = time.perf_counter() - start
    placement: dict[str, int] = {}
    for device in getattr(model, "hf_device_map", {}).values():
        placement[str(device)] = placement.get(str(device), 0) + 1
    return {"step": name, "seconds": seconds, "load_s": load_s, "load_peak_kib": load_peak,
            "peak_rss_kib": status_kib()["VmHWM"], "peak_rss_anon_kib": sampler.peak["RssAnon"],
            "peak_reset_ok": reset, "placement": placement, "checks": checks}


def _child(argv: list[str]) -> None:
    name, config = argv
    print(json.dumps(measure(name, Config.from_dict(json.loads(config)))))


# ----------------------------------------------------------------------------- the run
def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Build (or reuse) the checkpoint, measure every step, return the tables."""
    start = time.perf_counter()
    record = write_random_llama(cfg.folder(), cfg.llama(), dtype=_dtype(cfg.dtype),
                                seed=cfg.seed)
    build_s = time.perf_counter() - start
    cap = parse_size(cfg.cpu_cap)
    if cap >= record["bytes"]:
        raise ValueError(f"cpu_cap {cfg.cpu_cap} holds the whole model ({record['bytes']} "
                         "bytes): choose a cap below its size")
    loaded = None if cfg.subprocess else _load(cfg)
    found = []
    for name in STEPS:
        if not cfg.subprocess:
            found.append(measure(name, cfg, loaded))
            continue
        try:
            found.append(run_json_child([str(Path(__file__).resolve()), CHILD_FLAG, name,
                                         json.dumps(asdict(cfg))],
                                        timeout_s=cfg.child_timeout_s, what=name))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:  # a row, not a lost run
            found.append({"step": name, "error": _last_line(str(exc))})
    return _tables(cfg, record, build_s, cap, found)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _tables(cfg: Config, record: dict[str, Any], build_s: float, cap: int,
            found: list[dict[str, Any]]) -> dict[str, pd.DataFrame]:
    nan = float("nan")
    base = found[0] if "error" not in found[0] else {
        "seconds": nan, "peak_rss_anon_kib": nan, "placement": {}, "peak_reset_ok": False}
    mib = KIB_PER_MIB
    timing = pd.DataFrame([{"step": f["step"], "error": f["error"]} if "error" in f else {
        "step": f["step"], "seconds": f["seconds"],
        "ratio_to_forward": f["seconds"] / base["seconds"],
        "peak_rss_mib": f["peak_rss_kib"] / mib,
        "peak_rss_anon_mib": f["peak_rss_anon_kib"] / mib,
        "extra_anon_over_forward_mib": (f["peak_rss_anon_kib"] - base["peak_rss_anon_kib"]) / mib,
        "anon_peak_over_cap_mib": f["peak_rss_anon_kib"] / mib - cap / 2**20,
        "load_s": f["load_s"], "load_peak_rss_mib": f["load_peak_kib"] / mib,
        "error": "",
    } for f in found])
    checks = [{"step": f["step"], "check": k, "value": v}
              for f in found for k, v in f.get("checks", {}).items()]
    placement = base["placement"]
    checks += [{"step": "model", "check": "parameters", "value": float(record["n_params"])},
               {"step": "model", "check": "checkpoint MiB", "value": record["bytes"] / 2**20},
               {"step": "model", "check": "cpu cap MiB", "value": cap / 2**20},
               {"step": "model", "check": "build or reuse seconds", "value": build_s},
               {"step": "model", "check": "modules on disk", "value": float(
                   placement.get("disk", 0))},
               {"step": "model", "check": "modules in RAM (cpu)", "value": float(
                   placement.get("cpu", 0))},
               {"step": "all", "check": "peak reset worked in every step (1 = yes)",
                "value": float(all(f.get("peak_reset_ok", False) for f in found))},
               {"step": "all", "check": "torch threads", "value": float(cfg.threads)}]
    return {"timing": timing, "checks": pd.DataFrame(checks)}


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == [CHILD_FLAG]:
        _child(args[1:])
        return
    from harness.runs import analysis_main

    analysis_main("bench_big", __doc__, Config, run, argv=argv)


if __name__ == "__main__":
    main()

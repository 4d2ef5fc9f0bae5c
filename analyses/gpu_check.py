"""GPU check: capture equals eager attention on the SDPA (and flash) path, and the census,
activation patching and direct logit attribution run in half precision on the device, timed
against a plain forward.

Prepared for a machine with an accelerator (a few minutes there): ``python
analyses/gpu_check.py --device cuda [--dtype bf16]``. ``--device cpu --smoke`` runs the same
checks on a tiny model (the tests do).

**The model.** A random LLaMA-layout decoder (``shape``: hidden 1024, 12 layers of 16 heads,
MLP 4096; vocabulary = the packaged MiniLM tokenizer's 30,522 tokens: 264 M parameters),
seeded, built in float32 on the CPU and moved to ``device`` in ``dtype`` (the default SDPA
attention). Inputs: the first ``n_texts`` sentences of ``data/census_sentences.txt``, and the
clean/corrupted pair of ``bench_big.py`` (17 tokens each) for patching and DLA.

**Checks** (table ``checks``; ``passed`` 1 = yes):

- *capture = eager*: ``ap.extract`` on the SDPA model against ``output_attentions`` of an
  eager twin (same weights, ``attn_implementation="eager"``), every layer and head of every
  text. A captured layer computes its attention the way transformers' eager attention does
  (the same operations in the same order), so the maps equal the twin's up to the rounding
  of a probability to the model's dtype — the twin rounds its float32 softmax to ``dtype``,
  the capture may keep it in float32: ``|p_capture - p_eager| <= u · max(p_capture,
  p_eager)`` elementwise, with ``u`` the unit roundoff of ``dtype`` (bf16 ``2^-8``, fp16
  ``2^-11``, fp32 ``2^-24``). The same on the flash-attention path
  (``attn_implementation="flash_attention_2"``) when ``flash_attn`` is installed and the device
  is CUDA; otherwise the row says it was skipped.
- *census*: every head scored, mean entropies within ``[0, ln(tokens)]`` (an entropy of a
  distribution over at most ``n`` keys cannot leave that range).
- *patch.heads*: one row per scoped head, every effect finite.
- *DLA*: one row per head per example, and the gap between the components' sum and the
  model's own metric (reported: in bf16 the residual stream is rounded at every addition).

**Timings** (table ``timing``): each analysis and its baseline, a plain forward of the same
inputs under ``no_grad`` (the texts for capture and census, the clean and corrupted texts for
patching and DLA), ``warmup`` untimed then the median of ``repeats`` timed runs, the device
synchronised before each clock read; ``ratio`` = analysis / baseline; ``peak_mib`` the
device's peak allocated memory over the analysis (CUDA only). Tables as CSV plus
``gpu_check.md`` (markdown) go to ``runs/gpu_check/<UTC stamp>/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from bench_big import CLEAN, CORRUPT
from harness.benchmarking import FromDict
from harness.big_llama import LlamaShape, minilm_tokenizer, random_llama

import attnprobe as ap
from attnprobe.core.lines import split_lines
from attnprobe.load_options import DTYPES

DATA = Path(__file__).resolve().parent / "data"
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


@dataclass
class Config(FromDict):
    """Device, precision, model shape and sizes (defaults: the full run on CUDA, bf16)."""

    device: str = "cuda"
    dtype: str = "bf16"
    shape: dict[str, Any] = field(default_factory=lambda: asdict(LlamaShape(
        hidden=1024, layers=12, heads=16, kv_heads=16, intermediate=4096)))
    n_texts: int = 16
    patch_scope: str = "all"
    repeats: int = 3
    warmup: int = 1
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        """Hidden 64, 2 layers of 4 heads, 4 texts, one timed run."""
        return cls(shape=asdict(LlamaShape(hidden=64, layers=2, heads=4, kv_heads=4,
                                           intermediate=128, init_std=0.1)),
                   n_texts=4, repeats=1, warmup=0)

    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


# ----------------------------------------------------------------------------- models
FLASH_SKIPPED = "skipped: flash_attn is not installed or the device is not CUDA"


def _models(cfg: Config, vocab: int) -> tuple[dict[str, torch.nn.Module], str]:
    """The SDPA model, its eager twin and (CUDA with flash_attn) a flash twin, same weights;
    and why the flash twin is missing ("" when it is there)."""
    shape = LlamaShape(**cfg.shape)
    base = random_llama(shape, vocab, seed=cfg.seed)
    models = {"sdpa": base}
    twins = ["eager"]
    why = FLASH_SKIPPED
    if torch.device(cfg.device).type == "cuda" and importlib.util.find_spec("flash_attn"):
        twins.append("flash_attention_2")
        why = ""
    for name in twins:
        try:
            twin = random_llama(shape, vocab, seed=cfg.seed, attn_implementation=name)
            twin.load_state_dict(base.state_dict())
            models[name] = twin.to(device=cfg.device, dtype=cfg.torch_dtype())
        except Exception as exc:  # a broken flash install is a skipped row, not a lost run
            if name == "eager":
                raise
            why = f"skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
    models["sdpa"] = base.to(device=cfg.device, dtype=cfg.torch_dtype())
    return models, why


def _texts(cfg: Config) -> list[str]:
    lines = split_lines((DATA / "census_sentences.txt").read_text(encoding="utf-8"))
    return [line.strip() for line in lines if line.strip()][:cfg.n_texts]


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- checks
def capture_vs_eager(model: torch.nn.Module, eager: torch.nn.Module, tokenizer: Any,
                     rows: list[list[int]], u: float) -> dict[str, float]:
    """Worst ``|p_capture - p_eager|`` and worst ratio to its bound ``u · max(p, p')``."""
    maps = ap.extract(model, tokenizer, rows)
    worst, worst_ratio = 0.0, 0.0
    device = next(eager.parameters()).device
    for amap, ids in zip(maps, rows, strict=True):
        with torch.no_grad():
            out = eager(input_ids=torch.tensor([ids], device=device), output_attentions=True)
        ref = torch.stack([a[0] for a in out.attentions]).double().cpu()
        got = amap.pattern.double()
        diff = (got - ref).abs()
        bound = u * torch.maximum(got, ref)
        worst = max(worst, float(diff.max()))
        excess = diff[diff > 0] / bound[diff > 0]
        worst_ratio = max(worst_ratio, float(excess.max()) if excess.numel() else 0.0)
    return {"max |capture - eager|": worst, "max |capture - eager| / bound": worst_ratio}


def _check_rows(cfg: Config, models: dict[str, torch.nn.Module], flash_skipped: str,
                tokenizer: Any, rows: list[list[int]]) -> list[dict[str, Any]]:
    u = UNIT_ROUNDOFF[cfg.torch_dtype()]
    out = []
    for path in ("sdpa", "flash_attention_2"):
        if path not in models:
            out.append({"check": f"capture = eager ({path} path)", "value": float("nan"),
                        "ratio_to_bound": float("nan"), "passed": float("nan"),
                        "note": flash_skipped})
            continue
        found = capture_vs_eager(models[path], models["eager"], tokenizer, rows, u)
        ratio = found["max |capture - eager| / bound"]
        out.append({"check": f"capture = eager ({path} path)",
                    "value": found["max |capture - eager|"], "ratio_to_bound": ratio,
                    "passed": float(ratio <= 1.0),
                    "note": f"ratio_to_bound: worst |diff| / (u·max(p, p')), u = {u:.3g}"})
    return out


# ----------------------------------------------------------------------------- timed runs
def _timed(fn: Callable[[], Any], cfg: Config) -> tuple[float, Any, float]:
    """Median seconds over ``repeats`` (after ``warmup``), the last result, peak MiB."""
    cuda = torch.device(cfg.device).type == "cuda"
    seconds, result = [], None
    for i in range(cfg.warmup + cfg.repeats):
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        _sync(cfg.device)
        start = time.perf_counter()
        result = fn()
        _sync(cfg.device)
        if i >= cfg.warmup:
            seconds.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan")
    return statistics.median(seconds), result, peak


def _forward(model: torch.nn.Module, tokenizer: Any, texts: list[str]) -> Callable[[], Any]:
    encoded = tokenizer(texts, return_tensors="pt", padding=True)
    device = next(model.parameters()).device
    inputs = {"input_ids": encoded["input_ids"].to(device),
              "attention_mask": encoded["attention_mask"].to(device)}

    def go() -> Any:
        with torch.no_grad():
            return model(**inputs).logits
    return go


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Build the models, run the checks and the timed analyses; return the tables."""
    tokenizer = minilm_tokenizer()
    models, flash_skipped = _models(cfg, len(tokenizer))
    model = models["sdpa"]
    texts = _texts(cfg)
    rows = [tokenizer(t)["input_ids"] for t in texts]
    checks = _check_rows(cfg, models, flash_skipped, tokenizer, rows)
    for name in [k for k in models if k != "sdpa"]:
        del models[name]  # the twins are not timed: free their memory first
    n_layers, n_heads = cfg.shape["layers"], cfg.shape["heads"]
    pair = [CLEAN, CORRUPT]
    analyses: dict[str, tuple[Callable[[], Any], list[str]]] = {
        "capture (ap.extract)": (lambda: ap.extract(model, tokenizer, texts), texts),
        "census": (lambda: ap.heads.census(model, tokenizer, texts), texts),
        "patch.heads": (lambda: ap.patch.heads(model, tokenizer, CLEAN, CORRUPT, "next-token",
                                               scope=cfg.patch_scope), pair),
        "logit_attribution": (lambda: ap.heads.logit_attribution(
            model, tokenizer, pair, "next-token"), pair),
    }
    timing, results = [], {}
    for name, (fn, inputs) in analyses.items():
        base_s, _, base_peak = _timed(_forward(model, tokenizer, inputs), cfg)
        seconds, results[name], peak = _timed(fn, cfg)
        timing.append({"analysis": name, "seconds": seconds, "baseline_s": base_s,
                       "ratio": seconds / base_s, "peak_mib": peak,
                       "baseline_peak_mib": base_peak, "inputs": len(inputs)})
    checks += _result_checks(results, texts, tokenizer, n_layers, n_heads, cfg)
    info = pd.DataFrame([{"device": cfg.device, "dtype": cfg.dtype,
                          "device_name": _device_name(cfg.device),
                          "parameters": sum(p.numel() for p in model.parameters()),
                          "torch": torch.__version__,
                          "flash_attn": bool(importlib.util.find_spec("flash_attn"))}])
    return {"checks": pd.DataFrame(checks), "timing": pd.DataFrame(timing), "info": info}


def _result_checks(results: dict[str, Any], texts: list[str], tokenizer: Any,
                   n_layers: int, n_heads: int, cfg: Config) -> list[dict[str, Any]]:
    scores = results["census"].scores()
    longest = max(len(tokenizer(t)["input_ids"]) for t in texts)
    entropy = scores["entropy"]
    inside = bool(entropy.notna().all() and (entropy >= 0).all()
                  and (entropy <= math.log(longest)).all())
    patch = results["patch.heads"]
    scoped = n_layers * n_heads if cfg.patch_scope == "all" else float("nan")
    dla = results["logit_attribution"]
    totals = dla.totals
    gap = float((totals["gap"].abs() / totals["value"].abs()).max())
    head_rows = int((dla.table["kind"] == "head").sum())

    def row(check: str, value: float, passed: bool | float, note: str = "") -> dict[str, Any]:
        return {"check": check, "value": float(value), "ratio_to_bound": float("nan"),
                "passed": float(passed), "note": note}
    return [
        row("census: heads scored", len(scores), len(scores) == n_layers * n_heads),
        row("census: mean entropies within [0, ln(tokens)]", float(entropy.max()), inside,
            f"ln({longest}) = {math.log(longest):.4g}"),
        row("patch.heads: table rows", len(patch),
            len(patch) == scoped if cfg.patch_scope == "all" else float("nan")),
        row("patch.heads: finite effects", float(patch["effect"].notna().sum()),
            bool(patch["effect"].notna().all() and torch.isfinite(torch.tensor(
                patch["effect"].to_numpy())).all())),
        row("logit_attribution: head rows", head_rows, head_rows == 2 * n_layers * n_heads),
        row("logit_attribution: max |components - value| / |value|", gap, math.isfinite(gap),
            "reported (rounding of the residual stream in the model's dtype)"),
    ]


def _device_name(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


# ----------------------------------------------------------------------------- output
def _markdown(frame: pd.DataFrame) -> str:
    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |"
              for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def write_markdown(tables: dict[str, pd.DataFrame], folder: Path) -> None:
    """``gpu_check.md``: the device, the checks and the timings as markdown tables."""
    parts = [f"## gpu_check: {name}\n\n{_markdown(tables[name])}\n"
             for name in ("info", "checks", "timing")]
    (folder / "gpu_check.md").write_text("\n".join(parts), encoding="utf-8")


class _Configured:
    """``Config`` with the command line's device and dtype, as ``analysis_main`` builds it."""

    def __init__(self, **changes: Any) -> None:
        self.changes = changes

    def __call__(self) -> Config:
        return replace(Config(), **self.changes)

    def smoke(self) -> Config:
        return replace(Config.smoke(), **self.changes)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from harness.runs import analysis_main

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--device", default=Config.device)
    parser.add_argument("--dtype", default=Config.dtype, choices=sorted(DTYPES))
    known, rest = parser.parse_known_args(argv)
    if torch.device(known.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda needs a CUDA device "
                         "(torch.cuda.is_available() is False); use --device cpu --smoke here")
    analysis_main("gpu_check", __doc__, _Configured(device=known.device, dtype=known.dtype),
                  run, plot=write_markdown, argv=rest, show=["info", "checks", "timing"])


if __name__ == "__main__":
    main()

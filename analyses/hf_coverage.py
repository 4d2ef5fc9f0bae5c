"""Capture coverage over every text architecture of the installed transformers.

For each model type of transformers' text task mappings (causal / masked / seq2seq LM,
sequence / token classification, question answering, text encoding) that has a base model and
a text-only config, a tiny random model is built from its config class
(:mod:`harness.tiny_models`: hidden 32, 2 layers, 4 heads, init std 0.3 so attention is far
from uniform), loaded the default way (SDPA where the class has it), and given a padded batch
of 3 sequences (7, 4, 6 real tokens; left padding for decoder-only models, right otherwise;
decoder inputs of 5, 6, 3 tokens for encoder-decoder models). Then
:func:`check_type` compares ``attnprobe.capture`` with an eager twin holding the same
weights (:mod:`harness.attention_check`):

- *weights*: every padding-stripped map equals the twin's ``output_attentions`` entry of its
  role and layer, cropped to the example's real rows and keys (max |diff| <= 1e-4), and every
  reference layer has a map;
- *outputs*: every floating output of the captured forward equals the uncaptured one on real
  positions, within 4x the model's own SDPA-vs-eager difference of that output on the same
  input (measured with the eager twin) plus float32 rounding over the keys of each
  attention call the forward makes (:func:`harness.attention_check.output_bounds`);
- *shapes*: the weights and outputs checks again on longer batches (:data:`SHAPES`: 17, 11
  and 6 tokens, padded right, then left), past the tiny windows, chunks and pooling blocks;
- *restored*: hook count and every config's ``_attn_implementation`` are as before.

Status per type: ``PASS``; ``WRONG`` (a check failed); ``CRASH`` (an error that is not a
one-line ``AttnProbeError``, or the model's own forward failing under capture only);
``REFUSED`` (a one-line ``AttnProbeError``: models without attention weights must end here);
``NO_REFERENCE`` (the eager twin gives no weights in a known layout); ``BUILD_FAILED`` (config,
model or the uncaptured forward fails, or a time limit passes while building); ``SKIPPED``
(multimodal, no base model, or a base model that does not read token ids). Every type runs in
a worker process with a time limit, so one that hangs or dies is a row, not a stuck sweep.

Run: ``python analyses/hf_coverage.py [--smoke] [--types a,b,c] [--out DIR] [--readme]``;
tables ``coverage`` (one row per type), ``summary`` and ``reasons`` and ``provenance.json`` go
to ``runs/hf_coverage/<UTC stamp>/``; ``--readme`` rewrites the README's coverage section.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from harness import attention_check as ac
from harness import tiny_inputs as ti
from harness import tiny_models as tm
from harness.coverage_table import (
    readme_section,
    reasons,
    replace_section,
    summarize,
)
from harness.isolated import run_isolated, serve
from harness.runs import print_tables, provenance, run_dir, write_run

COLUMNS = ("model_type", "status", "reason", "where", "model_class", "implementation", "n_maps",
           "params", "weight_diff", "ref_tvd", "init_std", "has_reference", "seconds")
# one model per seam / failure class
SMOKE = ("bert", "gpt2", "llama", "albert", "gpt_neo", "bloom", "deberta-v2", "diffllama",
         "gpt_oss", "jamba", "mamba")
SEED = 0
# further input shapes every type is checked on: longer than the tiny configs' windows,
# chunks and pooling blocks (4), padded on each side (name, lengths, decoder lengths, side)
SHAPES = (("long right-padded", (17, 11, 6), (9, 12, 4), "right"),
          ("long left-padded", (17, 11, 6), (9, 12, 4), "left"))
# what a time limit means in each phase of a check
PHASE_STATUS = {"start": "BUILD_FAILED", "config": "BUILD_FAILED", "build": "BUILD_FAILED",
                "inputs": "BUILD_FAILED", "forward": "BUILD_FAILED",
                "reference": "NO_REFERENCE", "capture": "CRASH", "compare": "CRASH",
                "partial": "CRASH"}
README = Path(__file__).resolve().parents[1] / "README.md"


@dataclass
class Config:
    types: tuple[str, ...] = ()  # empty: every text model type
    workers: int = 2
    limit_s: float = 60.0  # per type; the worker is killed 30 s later if it does not stop
    recycle: int = 40  # types per worker process before a fresh one

    @classmethod
    def smoke(cls) -> Config:
        return cls(types=SMOKE)


class Timeout(BaseException):
    """The per-type time limit passed (a BaseException: model code's ``except Exception``
    must not swallow it)."""


class _Stop(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def _row(model_type: str, status: str = "", reason: str = "") -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(model_type=model_type, status=status, reason=reason, n_maps=0,
               has_reference=False)
    return row


def _forward(model: torch.nn.Module, inputs: dict[str, Any], **extra: Any) -> Any:
    torch.manual_seed(SEED)  # models that draw in eval (Reformer's LSH) draw the same
    with torch.no_grad():
        return model(**inputs, **extra)


def _built(model_type: str, row: dict[str, Any], phase: Callable[[str], None]) -> tuple:
    """Config, model, eager twin, batch and uncaptured output; a model whose activations are
    not finite at init std 0.3 is rebuilt at the family's default init."""
    for init_std in (tm.INIT_STD, None):
        phase("config")
        try:
            config = tm.tiny_config(model_type, init_std=init_std)
        except Exception as err:
            raise _Stop("BUILD_FAILED", f"config: {ac.describe_error(err)}") from None
        phase("build")
        try:
            model, twin = tm.build_pair(config, seed=SEED, spread=init_std is not None)
        except Exception as err:
            raise _Stop("BUILD_FAILED", f"build: {ac.describe_error(err)}") from None
        row.update(model_class=type(model).__name__, init_std=init_std,
                   implementation=model.config._attn_implementation,
                   params=sum(p.numel() for p in model.parameters()))
        phase("inputs")
        try:
            batch = ti.make_inputs(model_type, model, config)
        except Exception as err:
            raise _Stop("BUILD_FAILED", f"inputs: {ac.describe_error(err)}") from None
        encdec = bool(getattr(config, "is_encoder_decoder", False)) or "decoder" in batch.masks
        phase("forward")
        try:
            base = _forward(model, batch.inputs)
        except Exception as err:
            raise _Stop("BUILD_FAILED", f"forward without capture: {ac.describe_error(err)}"
                        ) from None
        bad = ac.finite_on_real(base, batch.masks, encdec)
        if not bad:
            return config, model, twin, batch, encdec, base
    raise _Stop("BUILD_FAILED", f"non-finite outputs without capture: {', '.join(bad)}")


def _capture(model: torch.nn.Module, inputs: dict[str, Any], scope: str = "all"
             ) -> tuple[Any, list, list[tuple[str, str, int]], BaseException | None]:
    """Output, maps and captured layers in the order they ran (or the error)."""
    import attnprobe

    try:
        torch.manual_seed(SEED)
        with torch.no_grad(), attnprobe.capture(model, scope) as cap:
            out = model(**inputs)
        runs = list(zip(cap.runs["stack"], cap.runs["kind"], cap.runs["layer"], strict=True))
        return out, cap.maps, runs, None
    except Exception as err:
        return None, [], [], err


def _evaluate(model_type: str, row: dict[str, Any], phase: Callable[[str], None]) -> None:
    import attnprobe

    config, model, twin, batch, encdec, base = _built(model_type, row, phase)
    phase("reference")
    refs, no_ref, ref_out = None, None, None
    try:
        ref_out = _forward(twin, batch.inputs, output_attentions=True, return_dict=True)
        refs = ac.reference(ref_out, model_type, config, batch.masks)
        row.update(has_reference=True,
                   ref_tvd=round(ac.distance_from_uniform(refs, batch.masks), 3))
    except ac.NoReference as err:
        no_ref = str(err)
    except Exception as err:
        no_ref = f"eager model: {ac.describe_error(err)}"
    phase("capture")
    hooks, state = attnprobe.count_hooks(model), ac.config_state(model)
    captured, maps, runs, err = _capture(model, batch.inputs)
    row["n_maps"] = len(maps)
    phase("compare")
    restored = []
    if attnprobe.count_hooks(model) != hooks:
        restored.append(ac.Issue("restored", f"{attnprobe.count_hooks(model) - hooks} hooks left"))
    if ac.config_state(model) != state:
        restored.append(ac.Issue("restored", "an _attn_implementation was not restored"))
    if err is not None:
        one_line = isinstance(err, attnprobe.AttnProbeError) and "\n" not in str(err).strip()
        status, reason = ("REFUSED", str(err)) if one_line else ("CRASH", ac.describe_error(err))
        row["where"] = ac.where(err)
        if restored:
            raise _Stop("WRONG", "; ".join(map(str, restored)) + f" after {status}: {reason}")
        raise _Stop(status, reason)
    if refs is None:
        raise _Stop("WRONG" if restored else "NO_REFERENCE",
                    "; ".join(map(str, [*restored, f"{no_ref} (capture gave {len(maps)} maps)"])))
    sinks = any("sink" in name for name, _ in model.named_parameters())
    issues, row["weight_diff"], unverified = ac.compare_maps(maps, refs, batch.masks, encdec,
                                                             sinks=sinks, runs=runs)
    depth = len(runs)  # attention calls of one forward, a looped model's repeats counted
    changed = _changed(base, ref_out, captured, batch, encdec, depth)
    # the same with one layer scoped (the first that has attention): the other layers run
    # their original attention, e.g. SDPA
    phase("partial")
    first = min(layer for amap in maps for layer in amap.layers)
    partial, partial_maps, _, err = _capture(model, batch.inputs, scope=f"layer:{first}")
    if err is not None:
        changed.append(ac.Issue("partial", f"scope layer:{first}: {ac.describe_error(err)}"))
    else:
        changed += _changed(base, ref_out, partial, batch, encdec, depth)
        changed += ac.compare_partial(maps, partial_maps, first)
    issues += changed + restored
    shape_issues, shape_notes = _other_shapes(model_type, model, twin, config, sinks, row)
    issues += shape_issues
    if issues:
        raise _Stop("WRONG", "; ".join(map(str, issues[:3]))
                    + (f"; and {len(issues) - 3} more" if len(issues) > 3 else ""))
    if unverified:
        raise _Stop("NO_REFERENCE", f"maps whose reference cannot be compared: "
                                    f"{'; '.join(unverified[:2])}")
    # PASS; entries of the twin that are no attention weights (and got no map) are noted
    notes = [row.get("reason") or "", *refs.notes, *shape_notes,
             *(f"not compared: {why}" for why in list(refs.unusable.values())[:2])]
    row.update(status="PASS", reason="; ".join(note for note in notes if note))


def _other_shapes(model_type: str, model: torch.nn.Module, twin: torch.nn.Module,
                  config: Any, sinks: bool, row: dict[str, Any]) -> tuple[list[Any], list[str]]:
    """The maps and outputs checks again on each of :data:`SHAPES` (longer inputs than the
    first batch, each padding side): issues (their detail names the shape) and notes for
    shapes that could not be checked (the model's own forward fails on them, or the capture
    refuses them in one line)."""
    import attnprobe

    issues: list[Any] = []
    notes: list[str] = []
    for name, lengths, dec_lengths, side in SHAPES:
        try:
            batch = ti.make_inputs(model_type, model, config, lengths, dec_lengths, side)
            encdec = bool(getattr(config, "is_encoder_decoder", False)) \
                or "decoder" in batch.masks
            base = _forward(model, batch.inputs)
            ref_out = _forward(twin, batch.inputs, output_attentions=True, return_dict=True)
            refs = ac.reference(ref_out, model_type, config, batch.masks)
        except Exception as err:  # not the capture's: the model or its reference
            notes.append(f"{name}: not checked ({ac.describe_error(err)[:80]})")
            continue
        if ac.finite_on_real(base, batch.masks, encdec):
            notes.append(f"{name}: not checked (non-finite outputs without capture)")
            continue
        captured, maps, runs, err = _capture(model, batch.inputs)
        if err is not None:
            if isinstance(err, attnprobe.AttnProbeError) and "\n" not in str(err).strip():
                notes.append(f"{name}: refused: {err}")
            else:
                issues.append(ac.Issue("shape", f"{name}: {ac.describe_error(err)}"))
            continue
        found, _, _ = ac.compare_maps(maps, refs, batch.masks, encdec, sinks=sinks, runs=runs)
        found += _changed(base, ref_out, captured, batch, encdec, len(runs))
        issues += [ac.Issue(i.check, f"{name}: {i.detail}", i.worst) for i in found]
    return issues, notes


def _changed(base: Any, ref_out: Any, captured: Any, batch: Any, encdec: bool,
             depth: int) -> list[Any]:
    """How the captured outputs differ from the uncaptured ones by more than the model's
    own SDPA-vs-eager difference allows (:func:`harness.attention_check.output_bounds`,
    measured on the same input: captured layers run the model's eager attention, the
    others its default; ``depth``: attention calls per forward)."""
    bounds = ac.output_bounds(base, ref_out, batch.masks, encdec, depth)
    return ac.compare_outputs(base, captured, batch.masks, encdec, bounds)


def check_type(model_type: str, phase: Callable[[str], None] | None = None,
               limit_s: float | None = None) -> dict[str, Any]:
    """One row of the coverage table (see module docstring). ``limit_s`` arms a SIGALRM time
    limit (main thread only); ``phase(name)`` is told each step as it starts."""
    row = _row(model_type)
    current = ["start"]

    def step(name: str) -> None:
        current[0] = name
        if phase is not None:
            phase(name)

    def alarm(signum: int, frame: Any) -> None:
        raise Timeout()

    armed = limit_s is not None
    if armed:
        previous = signal.signal(signal.SIGALRM, alarm)
        signal.alarm(max(1, int(limit_s)))
    start = time.perf_counter()
    try:
        _evaluate(model_type, row, step)
    except _Stop as stop:
        row.update(status=stop.status, reason=stop.reason)
    except Timeout:
        row.update(status=PHASE_STATUS[current[0]],
                   reason=f"timeout: still in {current[0]} after {limit_s:.0f} s")
    except Exception as err:  # the checker's own fault: never a silent pass
        row.update(status="CRASH", reason=f"checker: {ac.describe_error(err)}")
    finally:
        if armed:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        row["seconds"] = round(time.perf_counter() - start, 2)
    return row


# ------------------------------------------------------------------ sweep
def _worker() -> None:
    """Child process: quiet, one thread, each type under a SIGALRM limit."""
    import logging
    import warnings

    import transformers

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    limit = float(os.environ.get("HF_COVERAGE_LIMIT_S", "60"))
    serve(lambda job, phase: check_type(job, phase, limit_s=limit))


def _failed(job: str, phase: str, why: str) -> dict[str, Any]:
    return _row(job, PHASE_STATUS.get(phase, "CRASH"), f"{why} (phase {phase})")


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    catalogue = {m.name: m for m in tm.text_model_types()}
    names = list(cfg.types) or list(catalogue)
    unknown = [n for n in names if n not in catalogue]
    rows = {n: _row(n, "SKIPPED", "not a model type of the text task mappings") for n in unknown}
    rows.update({n: _row(n, "SKIPPED", catalogue[n].skip) for n in names
                 if n in catalogue and catalogue[n].skip})
    jobs = [n for n in names if n not in rows]
    env = {**os.environ, "HF_COVERAGE_LIMIT_S": str(cfg.limit_s)}
    done = [0]

    def progress(job: str, row: dict[str, Any]) -> None:
        done[0] += 1
        print(f"[{done[0]}/{len(jobs)}] {job}: {row['status']} {row['reason'][:100]}",
              file=sys.stderr, flush=True)

    rows.update(run_isolated(jobs, [sys.executable, str(Path(__file__).resolve()), "--worker"],
                             _failed, workers=cfg.workers, limit_s=cfg.limit_s + 30,
                             recycle=cfg.recycle, env=env, progress=progress))
    coverage = pd.DataFrame([rows[n] for n in names], columns=list(COLUMNS))
    return {"coverage": coverage, "summary": summarize(coverage), "reasons": reasons(coverage)}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="hf_coverage.py", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one model per seam / failure class")
    parser.add_argument("--types", help="comma-separated model types (default: every text type)")
    parser.add_argument("--out", type=Path,
                        help="output folder (default runs/hf_coverage/<stamp>/)")
    parser.add_argument("--readme", action="store_true", help="rewrite the README's coverage span")
    parser.add_argument("--workers", type=int, default=Config.workers, help="worker processes")
    args = parser.parse_args(argv)
    if args.readme:  # refused before the run, not after it
        try:
            replace_section(README.read_text(), "")
        except (OSError, ValueError) as err:
            parser.error(str(err))
    cfg = Config.smoke() if args.smoke else Config()
    if args.types:
        cfg.types = tuple(t.strip() for t in args.types.split(",") if t.strip())
    cfg.workers = args.workers
    out = run_dir("hf_coverage", args.out)
    start = time.perf_counter()
    tables = run(cfg)
    wall = time.perf_counter() - start
    print_tables(tables, ["summary"])
    print("\n== reasons ==")
    for _, group in tables["reasons"].iterrows():
        print(f"{group['status']} ({group['count']}): {group['reason'][:160]}\n"
              f"    {group['model_types']}")
    record = provenance("analyses/hf_coverage.py", cfg, wall)
    write_run(out, tables, record)
    if args.readme:
        import transformers

        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        versions = f"transformers {transformers.__version__}, torch {torch.__version__}, {stamp}"
        text = replace_section(README.read_text(), readme_section(tables["coverage"], versions))
        partial = README.with_suffix(".md.partial")
        partial.write_text(text)
        os.replace(partial, README)  # atomic: a reader sees the old or the new README
        print(f"README coverage section rewritten ({README})")
    print(f"\nwall time {wall:.1f} s; results written to {out}/")
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
    else:
        main()

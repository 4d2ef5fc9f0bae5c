"""Writing an analysis run: tidy tables, figures and a provenance record under runs/<name>/."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=False,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except OSError:
        return ""


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` (None or 0: left as they are) for the block,
    restored after it."""
    threads = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def provenance(script: str, config: Any, wall_s: float | None = None) -> dict[str, Any]:
    """What produced a run: script, config, versions of every library loaded, machine, git."""
    from attnprobe.core.version import __version__

    versions = {"attnprobe": __version__, "torch": torch.__version__,
                "pandas": pd.__version__, "python": platform.python_version()}
    for name in ("transformers", "captum", "spacy", "numpy"):
        if name in sys.modules:
            versions[name] = getattr(sys.modules[name], "__version__", "")
    return {
        "script": script,
        "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "config": asdict(config) if is_dataclass(config) else config,
        "wall_s": wall_s,
        "versions": versions,
        "machine": {"cpu_count": os.cpu_count(), "torch_num_threads": torch.get_num_threads(),
                    "platform": platform.platform()},
        "git": {"commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain"))},
    }


def run_dir(name: str, out: str | Path | None = None) -> Path:
    """``out`` or ``runs/<name>/<UTC stamp>/``, created."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = Path(out) if out is not None else Path("runs") / name / stamp
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_run(path: Path, tables: dict[str, pd.DataFrame], record: dict[str, Any]) -> Path:
    """Write every table as CSV and the provenance record as JSON into ``path``."""
    for name, frame in tables.items():
        frame.to_csv(path / f"{name}.csv", index=False)
    (path / "provenance.json").write_text(json.dumps(record, indent=1, default=str))
    return path


def print_tables(tables: dict[str, pd.DataFrame], names: list[str] | None = None) -> None:
    """Print tables for a terminal (the run's CSVs hold full precision)."""
    with pd.option_context("display.width", 200, "display.max_columns", 30,
                           "display.max_colwidth", 80, "display.float_format", "{:.4g}".format):
        for name in names or list(tables):
            print(f"\n== {name} ==")
            print(tables[name].to_string(index=False))


def memory_status_kib() -> dict[str, int]:
    """Current (``VmRSS``) and peak (``VmHWM``) resident memory of this process, KiB (Linux)."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0])
    return out


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); True when the reset demonstrably works."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    now = memory_status_kib()
    return now["VmHWM"] <= now["VmRSS"] + 1024  # within 1 MiB of the current RSS


def analysis_main(name: str, doc: str, config_cls: Any, run: Any, plot: Any = None,
                  argv: list[str] | None = None, show: list[str] | None = None) -> Path:
    """The command line every ``analyses/<name>.py`` shares: ``[--smoke] [--out DIR]``.

    Runs ``run(cfg)``, prints the tables named in ``show`` (all by default), draws
    ``plot(tables, folder)`` when given, and writes the tables and ``provenance.json`` to
    ``runs/<name>/<UTC stamp>/`` (or ``--out``).
    """
    import argparse
    import time

    parser = argparse.ArgumentParser(prog=f"{name}.py", description=doc.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, quick end-to-end check")
    parser.add_argument("--out", type=Path, help=f"output folder (default runs/{name}/<stamp>/)")
    args = parser.parse_args(argv)
    cfg = config_cls.smoke() if args.smoke else config_cls()
    out = run_dir(name, args.out)
    start = time.perf_counter()
    tables = run(cfg)
    wall = time.perf_counter() - start
    print_tables(tables, show)
    if plot is not None:
        plot(tables, out)
    write_run(out, tables, provenance(f"analyses/{name}.py", cfg, wall))
    print(f"\nwall time {wall:.1f} s; results written to {out}/")
    return out

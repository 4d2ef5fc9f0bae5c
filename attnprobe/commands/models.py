"""``attnprobe models``: the default model, the reference models and the tested HF families."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_models(args: argparse.Namespace) -> int:
    from attnprobe.loading import DEFAULT_MODEL, REF_PREFIX, TESTED_FAMILIES
    from attnprobe.models import REFERENCE_MODELS

    print(f"default: {DEFAULT_MODEL} (all-MiniLM-L6-v2, packaged, offline)")
    print("reference models:")
    for name in REFERENCE_MODELS.names():
        doc = (REFERENCE_MODELS.get(name).__doc__ or "").strip().splitlines()
        print(f"  {REF_PREFIX}{name:<18} {doc[0] if doc else ''}")
    print("tested HuggingFace families (any local model directory of these loads with --model "
          "PATH):")
    print("  " + ", ".join(TESTED_FAMILIES))
    return 0


def register(sub: Any) -> None:
    """Add ``models`` to the ``attnprobe`` sub-command parsers."""
    parser = sub.add_parser("models", help="list reference models and tested HF families")
    parser.set_defaults(run=cmd_models)

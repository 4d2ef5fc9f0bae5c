"""Checks of numeric arguments with one-line messages, shared by every entry point."""

from __future__ import annotations

import math
from typing import Any

import torch

from attnprobe.errors import InputError

__all__ = ["check_eval", "check_number", "check_per_example", "check_positive_ints"]


def check_number(name: str, value: Any, *, integer: bool, minimum: float,
                 strict: bool = False) -> None:
    """Raise InputError unless ``value`` is an int (``integer``) or a finite number, at least
    ``minimum`` (greater than it when ``strict``); bools are not numbers here."""
    kind = "an integer" if integer else "a finite number"
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if ok and not integer:
        ok = math.isfinite(value)
    if ok:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise InputError(f"{name} must be {kind} {bound}; got {value!r}")


def check_positive_ints(owner: str, **values: int | None) -> None:
    """Each given value (``None`` = not given) is an integer >= 1."""
    for name, value in values.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise InputError(f"{owner}: {name} must be a positive integer; got {value!r}")


def check_eval(model: Any) -> None:
    """Refuse a model in training mode: dropout would make every patched, perturbed or
    attributed number random. Shared by patching, perturbations and logit attribution."""
    if any(m.training for m in model.modules()):
        raise InputError("the model is in training mode (dropout makes every number random): "
                         "call model.eval()")


def check_per_example(value: Any, *, what: str, spec: str, rows: int | None,
                      unit: str) -> Any:
    """``value`` if it is a tensor ``[rows]`` (one ``unit`` per example); else an InputError
    naming what ``what`` (``"metric"``, ``"target"``) ``spec`` returned. Shared by metrics and
    attribution targets, which both read one number per example off a forward."""
    if not isinstance(value, torch.Tensor):
        raise InputError(f"{what} {spec!r} returned {type(value).__name__}; a {what} returns "
                         f"a tensor [batch], one {unit} per example")
    if value.ndim != 1 or (rows is not None and value.shape[0] != rows):
        raise InputError(f"{what} {spec!r} returned shape {tuple(value.shape)}; a {what} "
                         f"returns one {unit} per example, shape [{rows}]")
    return value

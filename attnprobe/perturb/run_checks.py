"""What :func:`~attnprobe.perturb.experiments.run` checks before the first forward: the
experiment named, whether it reads a target or a metric, the model, the sweep, and how long the
longest text runs (for the memory budget)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from torch import nn

from attnprobe.core.checks import check_eval
from attnprobe.core.options import option_flag
from attnprobe.core.registry import one_of
from attnprobe.errors import InputError
from attnprobe.inputs.text import max_length_of, token_lengths
from attnprobe.perturb.interventions import INTERVENTIONS
from attnprobe.perturb.job import EXPERIMENTS, SWEEPS, Experiment
from attnprobe.perturb.params import Params
from attnprobe.perturb.readout import OUTPUTS
from attnprobe.perturb.scoring import DEFAULT_METRIC, Scalar

__all__ = ["check_metric", "check_model", "check_sweep", "check_target", "experiment_named",
           "longest_tokens", "option_names", "params_of", "reads_metric", "reads_target"]

# the experiment that applies each intervention, for the message when one is named instead
_APPLIED_BY = {"zero": "ablate"}


def params_of(experiment: str) -> type[Params]:
    """The parameter dataclass of ``experiment`` (its options, defaults and help).

    Example:
        >>> import dataclasses
        >>> params = params_of("erase")
        >>> [(f.name, f.default) for f in dataclasses.fields(params)]
        [('max_erased', 1), ('rankings', ('attention', 'integrated_gradients', 'random')),
         ('n_steps', 50)]
    """
    return experiment_named(experiment).params


def experiment_named(name: Any) -> Experiment:
    """The registered experiment ``name``; InputError naming the choices (and the experiment
    that applies it, when ``name`` is an intervention)."""
    if isinstance(name, str) and name in EXPERIMENTS:
        return EXPERIMENTS.get(name)
    message = one_of("experiment", name, EXPERIMENTS.names())
    if isinstance(name, str) and name in INTERVENTIONS:
        runs = _APPLIED_BY.get(name, name)
        message += f" ({name!r} is a perturbation; the experiment {runs!r} applies it)"
    raise InputError(message)


def option_names(params: type[Params]) -> Callable[[str], str]:
    """``option -> "name (--flag)"`` for messages read by API and CLI users alike."""
    flags = {f.name: option_flag(f.name, f.metadata) for f in fields(params)}
    return lambda name: f"{name} ({flags.get(name, '--' + name.replace('_', '-'))})"


def longest_tokens(model: nn.Module, tokenizer: Any, texts: Sequence[str], mode: str,
             max_length: int | None) -> int:
    """Tokens of the longest text as it will be run (cut to the limit)."""
    longest = max(token_lengths(tokenizer, texts))
    limits = [n for n in (max_length_of(model, tokenizer), max_length) if n]
    return min(longest, *limits) if mode == "cut" and limits else longest


def check_model(model: Any, output: Any) -> None:
    """Refuse an unknown ``output``, something that is not a torch module, or a model in
    training mode."""
    if output not in OUTPUTS:
        raise InputError(one_of("output", output, OUTPUTS))
    if not isinstance(model, nn.Module):
        raise InputError(f"model must be a torch module; got {type(model).__name__}")
    check_eval(model)


def reads_target(experiment: str, **options: Any) -> bool:
    """Whether ``experiment`` with these options reads ``run(target=...)`` (``erase`` with an
    attribution ranking, ``importance``); the others refuse a target.

    Example:
        >>> reads_target("importance"), reads_target("ablate")
        (True, False)
        >>> reads_target("erase", rankings=("attention", "random"))   # no attribution ranking
        False
    """
    spec = experiment_named(experiment)
    return spec.params.build(spec.name, options).target_unread() is None


def check_target(name: str, params: Params, target: Any) -> None:
    """Refuse a target the experiment would not read (naming those that do)."""
    why = params.target_unread() if target is not None else None
    if why is not None:
        readers = [n for n in EXPERIMENTS.names()
                   if EXPERIMENTS.get(n).params().target_unread() is None]
        shown = target if isinstance(target, str) else type(target).__name__
        raise InputError(f"perturb {name} does not read target {shown!r}: {why} (target is "
                         f"read by {', '.join(readers)}); leave it out")


def reads_metric(experiment: str, **options: Any) -> bool:
    """Whether ``experiment`` with these options takes a scalar ``run(metric=...)``
    (module docstring); the others refuse one.

    Example:
        >>> ap.perturb.reads_metric("knockout"), ap.perturb.reads_metric("erase")  # True, False
    """
    spec = experiment_named(experiment)
    return spec.params.build(spec.name, options).metric_unread() is None


def check_metric(name: str, params: Params, output: str, scalar: Scalar | None) -> None:
    """Refuse a metric the experiment would not read, or one given with ``output``."""
    if scalar is None:
        return
    why = params.metric_unread()
    if why is not None:
        takers = [n for n in EXPERIMENTS.names()
                  if EXPERIMENTS.get(n).params().metric_unread() is None]
        raise InputError(f"perturb {name} does not take metric {scalar.spec!r}: {why} (a "
                         f"metric is read by {', '.join(takers)}); leave it out")
    if output != "auto":
        raise InputError(f"output={output!r} chooses what the default metric "
                         f"{DEFAULT_METRIC!r} compares; metric {scalar.spec!r} reads the "
                         "output itself: leave output out")


def check_sweep(spec: Experiment, sweep: Any) -> None:
    """Refuse an unknown sweep, or one the experiment does not run."""
    if sweep is None:
        return
    if sweep not in SWEEPS:
        raise InputError(f"unknown sweep {sweep!r}; choose one of "
                         f"{', '.join(map(repr, SWEEPS))} (or None)")
    if not spec.sweeps:
        takes = [name for name in EXPERIMENTS.names() if EXPERIMENTS.get(name).sweeps]
        raise InputError(f"sweep={sweep!r} runs {', '.join(takes)} one {sweep} at a time; "
                         f"{spec.name!r} does not sweep (give it a scope instead)")

"""How much memory a perturbation experiment will need, estimated before its first forward, so
a run that cannot fit is refused with a one-line error saying how to split it (instead of
being killed by the operating system half-way).

Two parts are estimated (bytes):

- **a forward** of ``rows`` copies of a ``seq``-token text (:func:`forward_bytes`): the
  attention weights ``rows × heads × seq × seq`` in a few copies per layer (scores, softmax,
  the edited and the recorded weights), the per-token activations ``rows × seq × width``, and
  the inputs. Without gradients only one layer's tensors are alive at a time; with gradients
  (``adversarial``, ``importance``) every layer's are kept for the backward pass, twice.
- **results held** while an experiment runs (:class:`Footprint` ``held``): e.g. the
  ``n_permutations × metrics`` distances of one text, from which the median is taken.

The budget is :data:`BUDGET_SHARE` of the memory available where the tensors live (the free
memory of the model's CUDA device for the forward, the available system memory for the rest).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from attnprobe.capture.info import attention_sizes
from attnprobe.core.residence import input_device
from attnprobe.errors import InputError

__all__ = ["BUDGET_SHARE", "Footprint", "available_bytes", "check_budget", "forward_bytes"]

BUDGET_SHARE = 0.8  # of the available memory; the rest is for Python, the model, the OS
ATTENTION_COPIES = 4  # scores, softmax weights, edited weights, a recorded or masked copy
ACTIVATION_COPIES = 8  # residual, q/k/v, attention output, feed-forward in/out, norms
INPUT_BYTES = 16  # input ids and attention mask, int64 each, per token
_HIDDEN = ("hidden_size", "d_model", "n_embd", "dim", "d_embed", "embed_dim")


class Footprint(NamedTuple):
    """What one experiment will need: ``rows`` per forward (of the longest text; the option
    ``rows_by`` sets them), whether gradients are taken, and ``held_count`` results of
    ``held_each`` bytes held besides (the option ``held_by`` sets their count)."""

    rows: int
    rows_by: str = "batch_size"
    grad: bool = False
    held_count: int = 0
    held_each: int = 0
    held_by: str = ""


def gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def _widths(model: nn.Module) -> tuple[int, int]:
    """``(hidden, widest)``: the model's residual width and its widest layer output (a
    feed-forward layer or an output over the vocabulary)."""
    widest = max((m.out_features for m in model.modules() if isinstance(m, nn.Linear)),
                 default=0)
    widest = max([widest, *(m.embedding_dim for m in model.modules()
                            if isinstance(m, nn.Embedding))])
    config = getattr(model, "config", None)
    hidden = next((v for name in _HIDDEN if isinstance(v := getattr(config, name, None), int)),
                  widest)
    return max(hidden, 1), max(widest, hidden, 1)


def forward_bytes(model: nn.Module, rows: int, seq: int, *, grad: bool = False) -> int:
    """An upper estimate of the memory one forward of ``rows × seq`` tokens needs (module
    docstring), in bytes."""
    n_layers, n_heads = attention_sizes(model)
    param = next(model.parameters(), None)
    itemsize = param.element_size() if param is not None else 4
    hidden, widest = _widths(model)
    per_layer = (rows * max(n_heads, 1) * seq * seq * ATTENTION_COPIES
                 + rows * seq * hidden * ACTIVATION_COPIES) * itemsize
    layers = max(n_layers, 1) * 2 if grad else 1  # kept for the backward, plus gradients
    output = rows * seq * widest * itemsize * 2  # e.g. logits over a vocabulary, and softmax
    return per_layer * layers + output + rows * seq * INPUT_BYTES


def _system_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """Memory available on ``device`` now (free CUDA memory, or available system memory);
    ``None`` when it cannot be told (then nothing is refused)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        return _system_available()
    return None


def _device_of(model: nn.Module) -> torch.device:
    return input_device(model)


def check_budget(model: nn.Module, experiment: str, need: Footprint, seq: int,
                 named: Callable[[str], str]) -> None:
    """Raise InputError when ``need`` (for texts of up to ``seq`` tokens) exceeds the budget;
    the message says which option to lower and to what (``named(option)`` names an option
    for the message, e.g. ``"batch_size (--batch-size)"``)."""
    device = _device_of(model)
    forward = forward_bytes(model, need.rows, seq, grad=need.grad)
    room = available_bytes(device)
    if room is not None and forward > BUDGET_SHARE * room:
        one = forward_bytes(model, 1, seq, grad=need.grad)
        most = int(BUDGET_SHARE * room // one)
        split = (f"set {named(need.rows_by)} to {most} or less" if most >= 1 else
                 f"even one row of {seq} tokens needs about {gib(one)}: shorten the texts "
                 "(truncation='cut' with a lower max length) or use a device with more memory")
        raise InputError(f"perturb {experiment}: a forward of {need.rows} rows x {seq} tokens "
                         f"needs about {gib(forward)} on {device.type}, more than the budget of "
                         f"{gib(BUDGET_SHARE * room)} ({BUDGET_SHARE:.0%} of the available "
                         f"memory); {split}")
    held = need.held_count * need.held_each
    system = room if device.type == "cpu" else available_bytes("cpu")
    if not held or system is None:
        return
    if device.type == "cpu":  # one pool holds both
        system -= forward
    budget = BUDGET_SHARE * max(system, 0)
    if held > budget:
        most = int(budget // need.held_each)
        raise InputError(f"perturb {experiment}: {named(need.held_by)} = {need.held_count} "
                         f"holds about {gib(held)} of results per text, more than the budget of "
                         f"{gib(budget)} ({BUDGET_SHARE:.0%} of the available memory); lower "
                         f"{named(need.held_by)} to {most} or less, or split the draws over "
                         "several runs with different seeds")

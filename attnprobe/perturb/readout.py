"""How a perturbation experiment reads a model's output and compares two outputs.

**Outputs** (``output=`` of :func:`~attnprobe.perturb.experiments.run`): ``"classifier"`` —
logits ``[batch, classes]``, compared as softmax distributions: ``tvd``, ``jsd`` (nats),
``flip`` (1 when the argmax changed) and ``top_prob`` (the probability of the class the
unperturbed model ranks first); ``"lm"`` — the next-token distribution at the last real
position, with the same metrics; ``"embedding"`` — the attention-masked mean of the last hidden
state (of the output tensor for models that return one tensor ``[batch, seq, dim]``):
``cosine_distance`` and ``l2_distance``. ``"auto"`` reads one forward: logits
``[batch, classes]`` → classifier; a transformers causal LM, or a causal reference model whose
output is ``[batch, seq, vocab]`` → lm; otherwise embedding.

:class:`Reader` turns an output into one vector per example, :func:`pick_reader` picks the reader
``auto`` means, :func:`measure` gives every metric of an output kind per example, and
:func:`row_max_sums` / :func:`mean_row_max` tally the ``max_attention`` of attention rows.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.perturb.measures import output_change

__all__ = ["OUTPUTS", "OutputChoice", "Reader"]

OutputChoice = Literal["auto", "classifier", "lm", "embedding"]
OUTPUTS: tuple[str, ...] = ("auto", "classifier", "lm", "embedding")


# ----------------------------------------------------------------------------- outputs
def _output_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def _logits(output: Any) -> torch.Tensor | None:
    logits = getattr(output, "logits", None)
    if logits is None and not hasattr(output, "keys"):  # HF ModelOutputs are mappings
        logits = _output_tensor(output)
    return logits if isinstance(logits, torch.Tensor) else None


def _hidden(output: Any) -> torch.Tensor | None:
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None and not hasattr(output, "keys"):
        hidden = _output_tensor(output)
    return hidden if isinstance(hidden, torch.Tensor) and hidden.ndim == 3 else None


def _last_real(inputs: Mapping[str, torch.Tensor] | None, batch: int, seq: int,
               device: torch.device) -> torch.Tensor:
    mask = inputs.get("attention_mask") if inputs is not None else None
    if mask is None:
        return torch.full((batch,), seq - 1, dtype=torch.long, device=device)
    mask = mask.to(device) != 0
    return seq - 1 - mask.flip(-1).to(torch.long).argmax(-1)


@dataclass(frozen=True)
class Reader:
    """Reads one vector per example off a model output: ``[batch, classes | vocab | dim]``.

    ``inputs`` (with ``attention_mask``) locate the last real token (lm) and the real tokens
    to average (embedding); without them every position is real.
    """

    kind: Literal["classifier", "lm", "embedding"]

    def __call__(self, output: Any, inputs: Mapping[str, torch.Tensor] | None = None
                 ) -> torch.Tensor:
        if self.kind == "embedding":
            hidden = _hidden(output)
            if hidden is None:
                raise InputError(f"output='embedding' needs the last hidden state [batch, seq, "
                                 f"dim]; the model returns {type(output).__name__} without one "
                                 "(load it without an output head, or use output='classifier' "
                                 "or 'lm')")
            mask = inputs.get("attention_mask") if inputs is not None else None
            if mask is None:
                return hidden.mean(1)
            weights = mask.to(hidden.device, hidden.dtype).unsqueeze(-1)
            return (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        logits = _logits(output)
        want = 2 if self.kind == "classifier" else 3
        if logits is None or logits.ndim != want:
            got = "no logits" if logits is None else f"logits of shape {list(logits.shape)}"
            shape = "[batch, classes]" if want == 2 else "[batch, seq, vocab]"
            raise InputError(f"output={self.kind!r} needs logits {shape}; the model gives {got}"
                             " (choose another output=)")
        if self.kind == "classifier":
            return logits
        rows = torch.arange(logits.shape[0], device=logits.device)
        return logits[rows, _last_real(inputs, logits.shape[0], logits.shape[1], logits.device)]


def _is_causal_lm(model: nn.Module, logits: torch.Tensor | None) -> bool:
    if logits is None or logits.ndim != 3:
        return False
    transformers = sys.modules.get("transformers")
    if transformers is not None and isinstance(model, transformers.PreTrainedModel):
        name = type(model).__name__
        return name.endswith("ForCausalLM") or name.endswith("LMHeadModel")
    config = getattr(model, "config", None)
    return bool(getattr(config, "causal", False)) \
        and logits.shape[-1] == getattr(config, "vocab_size", None)


def pick_reader(model: nn.Module, choice: str, output: Any) -> Reader:
    """The reader ``choice`` names, or the one ``auto`` picks from a forward's output."""
    if choice != "auto":
        return Reader(choice)  # type: ignore[arg-type]
    logits = _logits(output)
    if logits is not None and logits.ndim == 2:
        return Reader("classifier")
    if _is_causal_lm(model, logits):
        return Reader("lm")
    if _hidden(output) is not None:
        return Reader("embedding")
    raise InputError(f"output='auto' cannot tell what {type(model).__name__} returns "
                     f"({type(output).__name__}): pass output='classifier', 'lm' or 'embedding'")


# ----------------------------------------------------------------------------- measuring
def measure(kind: str, before: torch.Tensor, after: torch.Tensor
             ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per example ``(baseline, perturbed)`` of every metric of an output kind, ``[batch]``."""
    before = before.expand_as(after)
    zero = torch.zeros(after.shape[0], dtype=torch.float64)
    if kind == "embedding":
        change = output_change("embedding", before.double(), after.double())
        return {m: (zero, v.double().cpu()) for m, v in change.items()}
    change = output_change("classifier", before.double(), after.double())
    top = before.argmax(-1, keepdim=True)
    top_before = before.double().softmax(-1).gather(-1, top)[:, 0]
    top_after = after.double().softmax(-1).gather(-1, top)[:, 0]
    out = {m: (zero, change[m].double().cpu()) for m in ("tvd", "jsd", "flip")}
    out["top_prob"] = (top_before.cpu(), top_after.cpu())
    return out


def distances_of(kind: str) -> tuple[str, ...]:
    return ("cosine_distance", "l2_distance") if kind == "embedding" else ("tvd", "jsd", "flip")


def row_max_sums(pattern: torch.Tensor, original: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per leading index: the sum of each row's largest weight over the rows of ``original``
    with at least two weights > 0, and how many such rows; ``[..., query, key]`` -> ``[...]``
    summed over every axis but the first."""
    eligible = (original > 0).sum(-1) >= 2
    top = torch.where(eligible, pattern.amax(-1), 0.0).double()
    dims = tuple(range(1, top.ndim))
    return top.sum(dims).cpu(), eligible.sum(dims).cpu().double()


def mean_row_max(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    # rows with a single valid key put all their weight on it: 1.0 when there is nothing else
    return torch.where(count > 0, total / count.clamp(min=1), 1.0)

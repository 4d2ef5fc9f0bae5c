"""The shared pieces of the attribution methods: the :class:`Problem` a method explains, the
:class:`Explanation` it returns, the :class:`Method` protocol and the :data:`METHODS` registry.

The methods themselves live in :mod:`attnprobe.attribution.gradient_methods` (gradients) and
:mod:`attnprobe.attribution.perturbation_methods` (leave-one-out, occlusion); the entry point
is :func:`~attnprobe.attribution.methods.attribute`. The README's list of methods is generated
from :data:`METHODS` (``make readme``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

import torch
from torch import nn

from attnprobe.attribution.targets import Target
from attnprobe.core.registry import Registry
from attnprobe.errors import HookNotFiredError, InputError

__all__ = ["METHODS", "Explanation", "Method", "Problem"]


class Explanation(NamedTuple):
    """Scores ``[token]`` of one text and the method's convergence error (or None)."""

    scores: torch.Tensor
    delta: float | None = None


@dataclass(frozen=True, eq=False)
class Problem:
    """One text to explain: the model, its inputs, the fixed target and shared facts.

    Attributes:
        inputs: ``input_ids`` and ``attention_mask`` ``[1, seq]`` on the model's device.
        target: the target, already fixed on the unperturbed input.
        value: the target on the unperturbed input.
        special: bool ``[seq]``, True for special tokens ([CLS], [SEP], BOS ...).
        pad_id: baseline token id (:func:`~attnprobe.attribution.baseline.baseline_token`;
            None when no token fits); ``unk_id``: occlusion token id (may be None).
        baseline_note: a one-line warning naming the baseline token, given when a method
            first uses it (None for the pad or unk token).
        embedding: the input embedding layer, or None when it could not be resolved (only the
            gradient methods need it; they raise then).
    """

    model: nn.Module
    inputs: dict[str, torch.Tensor]
    target: Target
    value: float
    special: torch.Tensor
    pad_id: int | None
    unk_id: int | None
    embedding: nn.Module | None
    seed: int = 0
    batch_size: int = 8
    baseline_note: str | None = None

    @property
    def ids(self) -> torch.Tensor:
        return self.inputs["input_ids"]  # [1, seq]

    @property
    def n_tokens(self) -> int:
        return int(self.ids.shape[1])

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The target of the model on ``input_ids`` ``[batch, seq]`` -> ``[batch]``."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        output = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return self.target(output, {"input_ids": input_ids, "attention_mask": attention_mask})

    def evaluate(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The target on many unpadded variants ``[n, seq']``, ``batch_size`` rows per
        forward, without gradient -> ``[n]``."""
        values = []
        with torch.no_grad():
            for start in range(0, input_ids.shape[0], self.batch_size):
                values.append(self.forward(input_ids[start:start + self.batch_size]).detach())
        return torch.cat(values) if values else torch.zeros(0, device=input_ids.device)

    def layer(self) -> nn.Module:
        if self.embedding is None:
            raise InputError(f"no input embedding layer found in {type(self.model).__name__}:"
                             " pass embedding= (the module or its path)")
        return self.embedding

    def baseline_id(self) -> int:
        """The baseline token's id; its note (a token other than pad or unk) is a warning."""
        if self.pad_id is None:
            raise InputError("no token of the tokenizer fits the model's input embedding to "
                             "serve as the attribution baseline")
        if self.baseline_note is not None:
            warnings.warn(self.baseline_note, UserWarning, stacklevel=3)
        return self.pad_id

    def baseline_ids(self) -> torch.Tensor:
        """The input with every non-special token replaced by the baseline token,
        ``[1, seq]``."""
        return torch.where(self.special.unsqueeze(0), self.ids,
                           torch.full_like(self.ids, self.baseline_id()))

    def embedded(self, input_ids: torch.Tensor) -> torch.Tensor:
        """What the embedding layer outputs during the forward on ``input_ids``."""
        seen: list[torch.Tensor] = []
        handle = self.layer().register_forward_hook(lambda _m, _i, out: seen.append(out))
        try:
            with torch.no_grad():
                self.forward(input_ids)
        finally:
            handle.remove()
        if not seen:
            raise HookNotFiredError(f"embedding layer {type(self.embedding).__name__} was not "
                                    "called by the forward: pass embedding=")
        return seen[0].detach()

    def forward_from_embeddings(self, embeds: torch.Tensor,
                                attention_mask: torch.Tensor) -> torch.Tensor:
        """The target when the embedding layer outputs ``embeds`` ``[batch, seq, d]``."""
        ids = self.ids.expand(embeds.shape[0], -1)
        fired = []

        def replace(_module: nn.Module, _inputs: Any, out: torch.Tensor) -> torch.Tensor:
            fired.append(True)
            return embeds.to(out.dtype)

        handle = self.layer().register_forward_hook(replace)
        try:
            value = self.forward(ids, attention_mask)
        finally:
            handle.remove()
        if not fired:
            raise HookNotFiredError(f"embedding layer {type(self.embedding).__name__} was not "
                                    "called by the forward: pass embedding=")
        return value


class Method(Protocol):
    """An attribution method: parameters as fields, a name, a ``summary`` (one phrase for the
    README's generated list of methods) and one verb. A method written in a module of
    :mod:`attnprobe.attribution` is imported with the package (it is discovered)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    knob: ClassVar[str | None]  # the parameter to lower when a text is over budget

    def cost(self, n_tokens: int) -> int: ...

    def explain(self, problem: Problem) -> Explanation: ...


METHODS: Registry[type] = Registry("attribution method")

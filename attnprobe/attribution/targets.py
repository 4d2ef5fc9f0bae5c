"""What an attribution explains: one scalar per example, read off the model's output.

A :class:`Target` turns ``(output, inputs)`` into a tensor ``[batch]``; every attribution
method differentiates or perturbs that number. :func:`parse_target` builds one from a spec:

==================  ========================================================================
spec                the scalar
==================  ========================================================================
``class:K``         logit ``K`` of a classifier (``output.logits`` or a ``[batch, classes]``
                    tensor)
``prob:K``          softmax probability of class ``K``
``next-token``      causal LM: the logit of the model's own top next token at the last real
                    position. The token is chosen once, on the unperturbed input
                    (:meth:`Target.fixed`), and then held: the fixed target's spec names it,
                    e.g. ``next-token:464``
``next-token:T``    the logit of token ``T`` at the last real position (an id, or a name
                    read mid-sentence as :mod:`attnprobe.core.metric_tokens` reads it)
``similarity:TEXT`` embedding model: cosine similarity between the attention-masked mean of
                    the last hidden state and that of ``TEXT`` (computed once, no gradient)
==================  ========================================================================

A callable ``(output, inputs) -> Tensor[batch]`` is wrapped as a target with spec ``custom``.
New kinds are registered in :data:`TARGET_KINDS` as ``builder(argument, model, tokenizer)``,
where ``argument`` is the text after the first ``:`` (empty when there is none).

Example:
    >>> target = parse_target("class:1", model, tokenizer)
    >>> target(model(**batch), batch)  # tensor [batch]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnprobe.core.checks import check_per_example
from attnprobe.core.metric_tokens import resolve_token
from attnprobe.core.positions import batch_rows
from attnprobe.core.registry import Registry, one_of
from attnprobe.errors import InputError
from attnprobe.inputs.text import encode, model_inputs

__all__ = ["TARGET_KINDS", "Target", "TargetFn", "parse_target", "refixed"]

Inputs = Mapping[str, torch.Tensor]
# what a target computes, and what the views that explain one take: a Target is one
TargetFn = Callable[[Any, Inputs], torch.Tensor]


@dataclass(frozen=True, eq=False)
class Target:
    """One scalar per example, read off a model output.

    Args:
        spec: what is explained, as written into every result (``class:1``,
            ``next-token:464``, ``similarity:<text>``, ``custom``).
        fn: ``(output, inputs) -> Tensor[batch]``; ``output`` is what the model returned (an
            HF ModelOutput, a tensor or a tuple), ``inputs`` holds ``input_ids`` and
            ``attention_mask`` ``[batch, seq]``.
        choose: for targets that must first be fixed on the unperturbed input (``next-token``
            without an id): ``(output, inputs) -> Target``; ``None`` for ready targets.
    """

    spec: str
    fn: TargetFn | None = field(default=None, repr=False)
    choose: Callable[[Any, Inputs], Target] | None = field(default=None, repr=False)

    @property
    def ready(self) -> bool:
        """False while the target still has to be fixed on an unperturbed forward."""
        return self.choose is None

    def fixed(self, output: Any, inputs: Inputs) -> Target:
        """The target held fixed for this input (``next-token`` picks its token here).

        Call it with the output of the *unperturbed* forward; perturbed forwards must then
        use the returned target. Ready targets return themselves.
        """
        if self.choose is None:
            return self
        with torch.no_grad():
            return self.choose(output, inputs)

    def __call__(self, output: Any, inputs: Inputs) -> torch.Tensor:
        """The scalar of each example, ``[batch]``."""
        if self.choose is not None or self.fn is None:
            raise InputError(f"target {self.spec!r} is not fixed yet: call "
                             "target.fixed(output, inputs) on the unperturbed forward first")
        return check_per_example(self.fn(output, inputs), what="target", spec=self.spec,
                                 rows=batch_rows(inputs), unit="scalar")


Builder = Callable[[str, nn.Module, Any], Target]
TARGET_KINDS: Registry[Builder] = Registry("target kind")


def parse_target(spec: str | Target | Callable[[Any, Inputs], torch.Tensor], model: nn.Module,
                 tokenizer: Any) -> Target:
    """Build the :class:`Target` that ``spec`` names for this model.

    Args:
        spec: ``"class:K"``, ``"prob:K"``, ``"next-token"``, ``"next-token:ID"``,
            ``"similarity:TEXT"``, a :class:`Target` (returned as is) or a callable
            ``(output, inputs) -> Tensor[batch]`` (spec ``custom``).
        model: the model whose output is read (class counts and vocabulary size are checked
            against it where it declares them; ``similarity`` runs it once on ``TEXT``).
        tokenizer: its tokenizer.

    Raises:
        InputError: unknown kind, class index out of range, token id outside the vocabulary,
            empty similarity text, or a model without logits for a logit target.

    Example:
        >>> target = parse_target("next-token", lm, lm_tok)     # chosen on a reference run
        >>> ids = lm_tok([prompt], return_tensors="pt")
        >>> logits = lm(**ids)                          # [batch, seq, vocab]
        >>> fixed = target.fixed(logits, ids)
        >>> fixed.spec == f"next-token:{int(logits[0, -1].argmax())}"
        True
        >>> torch.equal(fixed(logits, ids), logits[:, -1].max(-1).values)   # [batch]
        True
    """
    if isinstance(spec, Target):
        return spec
    if isinstance(spec, str):
        kind, _, argument = spec.strip().partition(":")
        kind = kind.strip().lower()
        if kind not in TARGET_KINDS:
            raise InputError(one_of("target kind", kind, TARGET_KINDS.names())
                             + " (e.g. 'class:1'), or pass a callable (output, inputs) -> "
                             "Tensor[batch]")
        return TARGET_KINDS.get(kind)(argument, model, tokenizer)
    if callable(spec):
        return Target("custom", spec)
    raise InputError(f"target must be a spec such as 'class:1', a Target or a callable "
                     f"(output, inputs) -> Tensor[batch]; got {type(spec).__name__}")


def refixed(target: Target, spec: str, model: nn.Module, tokenizer: Any) -> Target:
    """``target`` as the methods fixed it on a text, rebuilt from the spec they recorded
    (``next-token`` -> ``next-token:ID``), so the attention views follow the same token;
    ready targets (and a custom one, whose spec parses to nothing) as they are.

    Example:
        >>> target = parse_target("next-token", lm, lm_tok)
        >>> refixed(target, "next-token:7", lm, lm_tok).spec
        'next-token:7'
    """
    if target.ready:
        return target
    try:
        return parse_target(spec, model, tokenizer)
    except InputError:  # a custom target whose fixed spec is no parseable spec
        return target


# ---------------------------------------------------------------------------- reading outputs
def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def _logits(output: Any, spec: str) -> torch.Tensor:
    """``output.logits``, or the output tensor (first element of a tuple)."""
    logits = getattr(output, "logits", None)
    if logits is None and not hasattr(output, "keys"):  # HF ModelOutputs are mappings
        logits = _first_tensor(output)
    if not isinstance(logits, torch.Tensor):
        raise InputError(f"target {spec} needs logits, but the model output "
                         f"({type(output).__name__}) has none: use a model with an output "
                         "head, a similarity:TEXT target or a callable target")
    return logits


def _class_logits(output: Any, spec: str, index: int) -> torch.Tensor:
    logits = _logits(output, spec)
    if logits.ndim != 2:
        hint = " (a language model? use next-token)" if logits.ndim == 3 else ""
        raise InputError(f"target {spec} needs logits [batch, classes]; the model gives "
                         f"{list(logits.shape)}{hint}")
    _check_class(index, logits.shape[-1])
    return logits


def _check_class(index: int, n_classes: int) -> None:
    if not 0 <= index < n_classes:
        raise InputError(f"target class {index} out of range: the model has {n_classes} "
                         f"classes (0..{n_classes - 1})")


def _last_real(inputs: Inputs, batch: int, seq: int, device: torch.device) -> torch.Tensor:
    """Index of each row's last real token (works for left and right padding)."""
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    if mask is None:
        return torch.full((batch,), seq - 1, dtype=torch.long, device=device)
    mask = mask.to(device) != 0
    if not bool(mask.any(-1).all()):
        raise InputError("a row of attention_mask has no real token")
    return seq - 1 - mask.flip(-1).to(torch.long).argmax(-1)


def _next_token_logits(output: Any, inputs: Inputs, spec: str) -> torch.Tensor:
    """Logits at each row's last real position, ``[batch, vocab]``."""
    logits = _logits(output, spec)
    if logits.ndim != 3:
        raise InputError(f"target {spec} needs language-model logits [batch, seq, vocab]; "
                         f"the model gives {list(logits.shape)} (a classifier? use class:K)")
    batch, seq, _ = logits.shape
    rows = torch.arange(batch, device=logits.device)
    return logits[rows, _last_real(inputs, batch, seq, logits.device)]


def _hidden(output: Any, spec: str) -> torch.Tensor:
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None and not hasattr(output, "keys"):
        hidden = _first_tensor(output)
    if not isinstance(hidden, torch.Tensor) or hidden.ndim != 3:
        raise InputError(f"target {spec} needs the last hidden state [batch, seq, hidden]; "
                         f"the model output ({type(output).__name__}) has none: load the "
                         "model without an output head (e.g. AutoModel) or use a callable")
    return hidden


def _mean_pool(hidden: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    """Attention-masked mean over positions, ``[batch, hidden]``."""
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    if mask is None:
        return hidden.mean(1)
    weights = mask.to(hidden.device, hidden.dtype).unsqueeze(-1)  # [batch, seq, 1]
    return (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)


# ---------------------------------------------------------------------------- model facts
def _is_headless_hf(model: nn.Module) -> bool:
    """An HF base model (``BertModel``, ``GPT2Model``, ...): it returns no logits."""
    return hasattr(model, "base_model_prefix") and getattr(model, "base_model", None) is model


def _declared_classes(model: nn.Module) -> int | None:
    """The number of classes when the model states it (HF sequence classifiers, reference
    classifiers), else None (checked on the first output instead)."""
    config = getattr(model, "config", None)
    n = getattr(config, "n_classes", None)
    if isinstance(n, int):
        return n
    if "ForSequenceClassification" in type(model).__name__:
        n = getattr(config, "num_labels", None)
        return n if isinstance(n, int) else None
    return None


def _vocab_size(model: nn.Module, tokenizer: Any) -> int | None:
    """Size of the output vocabulary: the unembedding, the config, or the tokenizer."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    n = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(n, int):
        return n
    try:
        return len(tokenizer)
    except TypeError:
        return None


def _integer(argument: str, spec: str, example: str) -> int:
    try:
        return int(argument.strip())
    except ValueError:
        raise InputError(f"target {spec!r} needs an integer, e.g. {example!r}") from None


def _no_logits_check(model: nn.Module, spec: str) -> None:
    if _is_headless_hf(model):
        raise InputError(f"target {spec} needs logits, but {type(model).__name__} has no "
                         "output head: load a model with one, or use similarity:TEXT")


# ---------------------------------------------------------------------------- kinds
def _class_index(kind: str, argument: str, model: nn.Module) -> tuple[int, str]:
    """The class index of ``kind:argument`` and its spec, checked against the model's head."""
    index = _integer(argument, f"{kind}:{argument}", f"{kind}:1")
    spec = f"{kind}:{index}"
    _no_logits_check(model, spec)
    declared = _declared_classes(model)
    if declared is not None:
        _check_class(index, declared)
    return index, spec


@TARGET_KINDS.register("class")
def _class(argument: str, model: nn.Module, tokenizer: Any) -> Target:
    index, spec = _class_index("class", argument, model)

    def logit(output: Any, inputs: Inputs) -> torch.Tensor:
        return _class_logits(output, spec, index)[:, index]

    return Target(spec, logit)


@TARGET_KINDS.register("prob")
def _prob(argument: str, model: nn.Module, tokenizer: Any) -> Target:
    index, spec = _class_index("prob", argument, model)

    def probability(output: Any, inputs: Inputs) -> torch.Tensor:
        return torch.softmax(_class_logits(output, spec, index), dim=-1)[:, index]

    return Target(spec, probability)


def _next_token_target(token: int, vocab: int | None) -> Target:
    spec = f"next-token:{token}"
    if vocab is not None and not 0 <= token < vocab:
        raise InputError(f"next-token id {token} is outside the vocabulary: the model has "
                         f"{vocab} tokens (0..{vocab - 1})")

    def logit(output: Any, inputs: Inputs) -> torch.Tensor:
        last = _next_token_logits(output, inputs, spec)
        if token >= last.shape[-1]:
            raise InputError(f"next-token id {token} is outside the vocabulary: the model "
                             f"gives {last.shape[-1]} logits")
        return last[:, token]

    return Target(spec, logit)


@TARGET_KINDS.register("next-token")
def _next_token(argument: str, model: nn.Module, tokenizer: Any) -> Target:
    _no_logits_check(model, "next-token")
    vocab = _vocab_size(model, tokenizer)
    if argument.strip():
        # a name is read as the metric vocabulary reads it: mid-sentence, one token
        return _next_token_target(resolve_token(argument, tokenizer,
                                                f"next-token:{argument.strip()}").id, vocab)

    def choose(output: Any, inputs: Inputs) -> Target:
        top = _next_token_logits(output, inputs, "next-token").argmax(-1)  # [batch]
        if int(top.numel()) > 1 and not bool((top == top[0]).all()):
            raise InputError("next-token picks the top token of each text, and the texts of "
                             "this batch differ: fix the target one text at a time")
        return _next_token_target(int(top[0]), vocab)

    return Target("next-token", choose=choose)


@TARGET_KINDS.register("similarity")
def _similarity(argument: str, model: nn.Module, tokenizer: Any) -> Target:
    text = argument.strip()
    if not text:
        raise InputError("target similarity needs a reference text, e.g. "
                         "'similarity:A cat sits on the mat.'")
    spec = f"similarity:{text}"
    batch = model_inputs(model, encode(model, tokenizer, [text], truncation=True))
    with torch.no_grad():
        reference = _mean_pool(_hidden(model(**batch), spec), batch)[0].detach()  # [hidden]

    def cosine(output: Any, inputs: Inputs) -> torch.Tensor:
        pooled = _mean_pool(_hidden(output, spec), inputs)  # [batch, hidden]
        ref = reference.to(pooled.device, pooled.dtype)
        return torch.nn.functional.cosine_similarity(pooled, ref.unsqueeze(0), dim=-1)

    return Target(spec, cosine)

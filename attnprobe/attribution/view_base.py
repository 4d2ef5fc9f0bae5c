"""The shared pieces of the attention views: the :class:`ViewInput` a view reads, the
:class:`View` base class and the :data:`VIEWS` registry.

A view turns one text into token importance read off the attention, one
:class:`~attnprobe.types.TokenAttribution` per requested layer (or one for a view that spans
every layer). A new view is one class::

    @VIEWS.register("last_layer_max")
    class LastLayerMax(View):
        name = "last_layer_max"

        def importance(self, inp: ViewInput) -> list[TokenAttribution]:
            layer = inp.amap.layers[-1]
            scores = inp.amap.pattern[-1].amax(0)[0].double()  # [key]
            return [inp.result(scores, inp.amap.key_tokens, f"{self.name}@L{layer}")]

after which ``attention_importance(..., views=["last_layer_max"])`` and
``compare(..., views=[...])`` run it. A view written in a module of
:mod:`attnprobe.attribution` is imported with the package (it is discovered), and the
README's list of views is generated from :data:`VIEWS` (``make readme``). The built-in views
live in :mod:`attnprobe.attribution.views` (raw, rollout),
:mod:`attnprobe.attribution.attention_flow` (flow) and :mod:`attnprobe.attribution.model_views`
(attention × gradient, norms).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import nn

from attnprobe.attribution.targets import TargetFn
from attnprobe.attribution.view_common import (
    Query,
    layer_position,
    map_causal,
    one_text,
    resolve_query,
)
from attnprobe.capture.context import capture
from attnprobe.capture.corpus import extract
from attnprobe.capture.info import causal_of
from attnprobe.core.registry import Registry
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.inputs.text import Truncation, encode, model_inputs
from attnprobe.types import AttentionMap, TokenAttribution

__all__ = ["VIEWS", "View", "ViewInput"]


@dataclass(eq=False)
class ViewInput:
    """One text as every view sees it.

    The self-attention map of every layer and head (:attr:`amap`) is extracted on first use
    and shared by the views that read it; a view that runs the model (``needs_model``) uses
    :attr:`model`, :attr:`tokenizer` and :attr:`text` with the same :attr:`truncation` and
    :attr:`max_length`, so it sees the same tokens.

    Attributes:
        text: the input text (empty when the view input was built from a map, or from
            ``inputs``).
        scope: the layers reported and, for ``raw`` and ``norm``, the heads averaged.
        query: which row the views read (:mod:`attnprobe.attribution.views`); ``"auto"`` is
            resolved on construction, from the model's kind (or the map's).
        target: ``(output, inputs) -> Tensor[batch]`` for the views that need one.
        example_id: carried into the results.
        inputs: the text already encoded, ``input_ids`` / ``attention_mask`` ``[1, seq]``
            (e.g. the context of a generated token, which must not be re-tokenised); used
            instead of ``text`` by the views that run the model.
    """

    text: str
    scope: Scope
    query: Query = "auto"
    target: TargetFn | None = None
    example_id: str = ""
    model: nn.Module | None = None
    tokenizer: Any = None
    truncation: Truncation = "error"
    max_length: int | None = None
    given_map: AttentionMap | None = field(default=None, repr=False)
    inputs: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.query, str) and self.query == "auto":
            causal = causal_of(self.model) if self.model is not None else None
            if causal is None and (self.model is not None or self.given_map is not None):
                causal = map_causal(self.amap)
            self.query = resolve_query(self.query, causal)

    def encoded(self) -> dict[str, torch.Tensor]:
        """The model's inputs for this text (``[1, seq]``), encoded as every view encodes it."""
        if self.inputs is not None:
            return model_inputs(self.model, dict(self.inputs))
        one_text(self.text)
        batch = encode(self.model, self.tokenizer, [self.text], truncation=self.truncation,
                       max_length=self.max_length)
        return model_inputs(self.model, batch)

    @cached_property
    def amap(self) -> AttentionMap:
        """The self-attention map ``[layer, head, query, key]`` of the text (every layer and
        head: rollout and flow multiply through all of them)."""
        if self.given_map is not None:
            return self.given_map
        if self.model is None:
            raise InputError("this view input has neither a map nor a model")
        if self.inputs is not None:
            with torch.no_grad(), capture(self.model, tokenizer=self.tokenizer,
                                          example_ids=[self.example_id]) as cap:
                self.model(**self.encoded())
            maps = [m for m in cap.maps if m.kind == "self"]
        else:  # distributed=False: compare already shares texts over the ranks
            maps = [m for m in extract(self.model, self.tokenizer, [self.text],
                                       truncation=self.truncation, max_length=self.max_length,
                                       distributed=False) if m.kind == "self"]
        if not maps:
            raise InputError("the model has no self-attention map to read")
        return maps[0]

    @cached_property
    def layers(self) -> tuple[int, ...]:
        """The model layers the scope asks for, among the map's layers (checked)."""
        for layer in self.scope.layers or ():
            layer_position(self.amap, layer)
        return tuple(layer for layer in self.amap.layers if self.scope.wants_layer(layer))

    def heads(self, layer: int) -> tuple[int, ...] | None:
        """The scope's heads of ``layer`` among the map's heads, or ``None`` when the scope
        holds every one of them (a plain mean over heads)."""
        held = self.amap.heads
        wanted = tuple(h for h in held if self.scope.contains(layer, h))
        if not wanted:
            raise InputError(f"scope {self.scope} holds no head of layer {layer} that the "
                             f"map has (heads {list(held)})")
        return None if wanted == held else wanted

    def result(self, scores: torch.Tensor, tokens: tuple[str, ...], method: str,
               target: str = "") -> TokenAttribution:
        """A view's importance ``[key]`` as a :class:`TokenAttribution` of this text."""
        return TokenAttribution(scores, tokens, method, target, self.example_id)


class View:
    """An attention view: a name, what it needs, and one verb.

    Class attributes:
        name: the registry name; results are named ``"{name}@L{layer}"`` per layer.
        summary: what it reads, one phrase (with its source), for the README's generated
            list of views (empty: the first line of the class docstring).
        needs_model: it runs the model itself (so it cannot be read off a stored map).
        needs_target: it explains a target (``ViewInput.target`` must be given).
    """

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    needs_model: ClassVar[bool] = False
    needs_target: ClassVar[bool] = False

    def check(self, model: nn.Module | None) -> None:
        """Refuse a model the view cannot read, before any forward (default: accept)."""

    def importance(self, inp: ViewInput) -> list[TokenAttribution]:
        """The view's importance of one text: one result per layer of ``inp.layers`` (or one
        for a view spanning every layer), each ``[key]`` float64."""
        raise NotImplementedError


VIEWS: Registry[type[View]] = Registry("attention view")

"""The one scope language: which layers and heads an analysis or an intervention touches.

The same strings work in the Python API (``scope=``) and on the command line (``--scope``);
case and spaces are ignored, layers and heads are 0-based model indices:

==================  =========================================================
``all``             every head of every layer (the default)
``layer:3``         every head of layer 3 (also ``3.*`` and ``L3``)
``layers:0-2``      layers 0, 1 and 2 (lists and ranges mix: ``layers:0-2,5``)
``head:3.5``        head 5 of layer 3 (also ``L3H5`` and ``3.5``)
``heads:0.2,1.8``   head 2 of layer 0 and head 8 of layer 1 (any heads, any layers)
``*.5``             head 5 of every layer (also ``L*H5``)
==================  =========================================================

Scopes merge: ``Scope.parse(["layer:0", "head:3.5"])``, ``a | b``, or a repeated ``--scope``
on the command line. ``str(scope)`` gives the canonical form back, which parses to the same
scope. Head labels read ``L{layer}H{head}`` (:func:`head_id`) everywhere in attnprobe.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import islice

from attnprobe.errors import InputError

__all__ = ["MAX_INDICES", "MAX_TERMS", "SCOPE_FORMS", "Scope", "ScopeLike", "head_id"]

Term = tuple[int | None, int | None]  # (layer, head); None means every one
MAX_INDICES = 4096  # no model has more layers or heads; stops "layers:0-99999999" early
# Named (layer, head) pairs a scope may hold: 4x the largest grid in use (126 x 128 heads).
# A scope is a set of terms, so a bigger one would cost memory and time before any model
# could refuse it; "every head" is one term ("all", "3.*", "*.5") at any size.
MAX_TERMS = 1 << 16
MAX_DIGITS = 9  # an index of 10 digits or more names no layer; int() of 4301 is an error
SHOWN = 60  # characters of a bad scope quoted in a message
SCOPE_FORMS = "all, layer:3, layers:0-2, head:3.5, heads:0.2,1.8, L3H5, *.5 or 3.*"

_HEAD_ITEM = re.compile(r"^l?(\d+|\*)(?:\.|h)(\d+|\*)$")
_LAYER_ITEM = re.compile(r"^l?(\d+)(?:-(\d+))?$")


def head_id(layer: int, head: int) -> str:
    """The conventional head label, e.g. ``L3H5`` (0-based model indices).

    Example:
        >>> head_id(3, 5)
        'L3H5'
    """
    return f"L{layer}H{head}"


def _shown(text: str) -> str:
    """``text`` quoted for a one-line message, cut to :data:`SHOWN` characters."""
    return repr(text if len(text) <= SHOWN else text[:SHOWN] + "...")


def _index(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        # repr() of an int of 4301+ digits is itself an error: say what it is instead
        shown = (_shown(repr(value)) if not isinstance(value, int) or value > -10**MAX_DIGITS
                 else "a large negative number")
        raise InputError(f"scope {what} must be non-negative integers; got {shown}")
    if value >= 10**MAX_DIGITS:  # as in the string form: no model has that many
        raise InputError(f"scope {what}: an index of more than {MAX_DIGITS} digits is too "
                         "large; no model has that many layers or heads")
    return value


def _indices(values: Sequence[int] | int | None, what: str) -> tuple[int, ...] | None:
    if values is None:
        return None
    if isinstance(values, int):
        values = (values,)
    elif not isinstance(values, Iterable):
        raise InputError(f"scope {what} must be integers or a list of them; got "
                         f"{type(values).__name__}")
    # read no more than a model can have: range(10**12) is refused, not materialised
    values = tuple(islice(values, MAX_INDICES + 1))
    if not values:
        raise InputError(f"scope {what} must not be empty; use None for all")
    if len(values) > MAX_INDICES:
        raise InputError(f"scope {what}: more than {MAX_INDICES} given; no model has that "
                         f"many (use None for all {what})")
    return tuple(sorted({_index(v, what) for v in values}))


def _number(digits: str, spec: str) -> int:
    if len(digits) > MAX_DIGITS:
        raise InputError(f"scope {_shown(spec)}: index {_shown(digits)} is too large; no "
                         "model has that many layers or heads")
    return int(digits)


def _simplify(terms: Iterable[Term]) -> frozenset[Term]:
    """Drop terms another term already covers (``3.5`` under ``3.*`` or ``*.5``)."""
    terms = set(terms)
    if (None, None) in terms:
        return frozenset({(None, None)})

    def covered(layer: int | None, head: int | None) -> bool:
        wider = {(layer, None), (None, head)} - {(layer, head)}
        return bool(wider & terms)

    return frozenset(term for term in terms if not covered(*term))


def _range(text: str, spec: str) -> range:
    match = _LAYER_ITEM.match(text)
    if match is None:
        raise InputError(f"scope {_shown(spec)}: {_shown(text)} is not a layer; write e.g. "
                         f"layers:0-2 (forms: {SCOPE_FORMS})")
    low = _number(match.group(1), spec)
    high = _number(match.group(2), spec) if match.group(2) is not None else low
    if high < low or high - low >= MAX_INDICES:
        raise InputError(f"scope {_shown(spec)}: bad range {_shown(text)}")
    return range(low, high + 1)


def _head_term(text: str, spec: str) -> Term:
    match = _HEAD_ITEM.match(text)
    if match is None:
        raise InputError(f"scope {_shown(spec)}: {_shown(text)} is not a head; write "
                         f"<layer>.<head> such as 3.5 (forms: {SCOPE_FORMS})")
    layer, head = (None if g == "*" else _number(g, spec) for g in match.groups())
    return layer, head


def _layers(items: list[str], spec: str) -> frozenset[Term]:
    ranges = [_range(item, spec) for item in items]
    if sum(len(r) for r in ranges) > MAX_INDICES:  # counted before a set is built
        raise InputError(f"scope {_shown(spec)} names more than {MAX_INDICES} layers; no "
                         "model has that many")
    return frozenset((layer, None) for r in ranges for layer in r)


def _parse_one(text: str) -> frozenset[Term]:
    spec = "".join(text.split()).lower()
    if spec in ("all", "*", "*.*"):
        return frozenset({(None, None)})
    if not spec:
        raise InputError(f"empty scope; use one of {SCOPE_FORMS}")
    shown = _shown(text)
    kind, colon, rest = spec.partition(":")
    if not colon:  # a bare item: L3H5, 3.5, *.5, 3.*, L3
        kind, rest = ("layer", spec[1:]) if re.fullmatch(r"l\d+", spec) else ("head", spec)
    items = [item for item in rest.split(",") if item]
    if not items:
        raise InputError(f"scope {shown} names nothing after the colon; e.g. 'layer:3'")
    if kind in ("layer", "layers"):
        return _layers(items, text)
    if kind in ("head", "heads"):
        return frozenset(_head_term(item, text) for item in items)
    raise InputError(f"scope {shown}: unknown form {_shown(kind)}; use {SCOPE_FORMS}")


def _check_size(n_terms: int) -> None:
    if n_terms > MAX_TERMS:
        raise InputError(f"a scope of more than {MAX_TERMS} heads named one by one; name "
                         "whole layers or heads instead ('all', 'layers:0-3', '*.5')")


def _ranges(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts, start = [], None
    for i, value in enumerate(values):
        if start is None:
            start = value
        if i + 1 == len(values) or values[i + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return ",".join(parts)


class Scope:
    """A set of attention heads: a union of ``(layer, head)`` terms, where ``None`` is every.

    ``Scope()`` is every head; ``Scope(layers=(3,))`` every head of layer 3;
    ``Scope((3,), (5, 7))`` heads 5 and 7 of layer 3 (a layers × heads product, as the
    ``layers=`` / ``heads=`` keywords of :func:`attnprobe.capture` mean); any other set comes
    from :meth:`parse` or ``|``. Immutable and hashable.
    """

    __slots__ = ("terms",)
    terms: frozenset[Term]

    def __init__(self, layers: Sequence[int] | int | None = None,
                 heads: Sequence[int] | int | None = None, *,
                 terms: Iterable[Term] | None = None) -> None:
        if terms is None:
            layer_set = _indices(layers, "layers") or (None,)
            head_set = _indices(heads, "heads") or (None,)
            _check_size(len(layer_set) * len(head_set))
            terms = ((layer, head) for layer in layer_set for head in head_set)
        elif layers is not None or heads is not None:
            raise InputError("give layers/heads or terms, not both")
        else:
            terms = list(islice(terms, MAX_TERMS + 1))
            _check_size(len(terms))
            terms = [(None if layer is None else _index(layer, "layers"),
                      None if head is None else _index(head, "heads")) for layer, head in terms]
        object.__setattr__(self, "terms", _simplify(terms))
        if not self.terms:
            raise InputError("a scope must name at least one head")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Scope is immutable")

    # ------------------------------------------------------------------ building
    @classmethod
    def parse(cls, spec: ScopeLike) -> Scope:
        """A scope from its string form, a :class:`Scope`, ``None`` (every head) or several
        of these (merged). See the module docstring for the forms."""
        if spec is None:
            return cls()
        if isinstance(spec, Scope):
            return spec
        if isinstance(spec, str):
            return cls(terms=_parse_one(spec))
        if isinstance(spec, Iterable):
            parts = [cls.parse(part) for part in spec]
            if not parts:
                raise InputError(f"an empty list of scopes; use one of {SCOPE_FORMS}")
            return cls(terms=frozenset().union(*(p.terms for p in parts)))
        raise InputError(f"scope must be a string such as 'layer:3'; got {type(spec).__name__}")

    def __or__(self, other: Scope) -> Scope:
        if not isinstance(other, Scope):
            return NotImplemented
        return Scope(terms=self.terms | other.terms)

    # ------------------------------------------------------------------ reading
    @property
    def is_all(self) -> bool:
        return self.terms == {(None, None)}

    @property
    def layers(self) -> tuple[int, ...] | None:
        """The layers named explicitly, or ``None`` when some term covers every layer."""
        if any(layer is None for layer, _ in self.terms):
            return None
        return tuple(sorted({layer for layer, _ in self.terms}))  # type: ignore[type-var]

    @property
    def is_grid(self) -> bool:
        """Whether the scope is a product ``layers × heads`` (what one map can hold)."""
        by_layer: dict[int | None, set[int | None]] = {}
        for layer, head in self.terms:
            by_layer.setdefault(layer, set()).add(head)
        return len({frozenset(heads) for heads in by_layer.values()}) == 1

    def wants_layer(self, layer: int) -> bool:
        return any(term_layer is None or term_layer == layer for term_layer, _ in self.terms)

    def layers_in(self, n_layers: int) -> tuple[int, ...]:
        """The model layers ``0..n_layers-1`` that hold a head of the scope."""
        return tuple(layer for layer in range(n_layers) if self.wants_layer(layer))

    def heads_of(self, layer: int, n_heads: int) -> tuple[int, ...]:
        """The heads of ``layer`` in the scope (out-of-range heads raise)."""
        chosen: set[int] = set()
        for term_layer, head in self.terms:
            if term_layer is not None and term_layer != layer:
                continue
            if head is None:
                return tuple(range(n_heads))
            if head >= n_heads:
                raise InputError(f"scope {self}: head {head} out of range at layer {layer}; "
                                 f"it has {n_heads} heads (0..{n_heads - 1})")
            chosen.add(head)
        return tuple(sorted(chosen))

    def head_cover(self, layers: Iterable[int], n_heads: int) -> tuple[int, ...]:
        """The union of the heads in scope over ``layers``: the smallest grid of heads that
        holds the scope on those layers (what an ``[layer, head, ...]`` array keeps)."""
        return tuple(sorted({h for layer in layers for h in self.heads_of(layer, n_heads)}))

    def contains(self, layer: int, head: int) -> bool:
        return any((lay is None or lay == layer) and (h is None or h == head)
                   for lay, h in self.terms)

    def mask(self, layers: Iterable[int], heads: Iterable[int]) -> list[bool]:
        """Per ``(layer, head)`` pair of two parallel columns (a table's ``layer`` and
        ``head``), whether the scope holds it: what keeps a table to exactly the scope when
        its maps hold the smallest grid around it (:meth:`head_cover`)."""
        return [self.contains(int(layer), int(head))
                for layer, head in zip(layers, heads, strict=True)]

    def validate(self, n_layers: int, n_heads: int, *, name: str = "the model") -> Scope:
        """Raise InputError when a layer or head does not exist (0 = unknown, not checked);
        return ``self``."""
        for what, index, size in (("layer", 0, n_layers), ("head", 1, n_heads)):
            bad = sorted({term[index] for term in self.terms
                          if term[index] is not None and size and term[index] >= size})
            if bad:
                raise InputError(f"scope {self}: {what}s {bad} out of range; {name} has "
                                 f"{size} {what}s (0..{size - 1})")
        return self

    def within(self, layers: Sequence[int], *, name: str = "the model") -> Scope:
        """The scope on ``layers`` only (the layers that run attention; a hybrid's recurrent
        layers run none): a term over every layer (``all``, ``*.5``) becomes one term per
        layer of ``layers``; a term naming another layer raises InputError.

        Example:
            >>> Scope.parse("*.2").within([1, 3])
            Scope('heads:1.2,3.2')
            >>> Scope.parse("layer:0").within([1, 3], name="JambaModel")
            Traceback (most recent call last):
            attnprobe.errors.InputError: scope layer:0: layer 0 of JambaModel runs no ...
        """
        allowed = sorted(set(layers))
        bad = sorted({layer for layer, _ in self.terms
                      if layer is not None and layer not in allowed})
        if bad:
            plural = "s" if len(bad) > 1 else ""
            raise InputError(f"scope {self}: layer{plural} {_ranges(bad)} of {name} run"
                             f"{'' if plural else 's'} no attention (a recurrent or "
                             f"state-space layer); its attention layers are {_ranges(allowed)}")
        if not allowed:
            return self
        return Scope(terms=[(lay, head) for layer, head in self.terms
                            for lay in ((layer,) if layer is not None else allowed)])

    # ------------------------------------------------------------------ identity
    def __str__(self) -> str:
        if self.is_all:
            return "all"
        whole = sorted(layer for layer, head in self.terms if head is None)  # type: ignore[type-var]
        if len(whole) == len(self.terms):
            return ("layer:" if len(whole) == 1 else "layers:") + _ranges(whole)
        items = [(layer is None, layer or 0, head is None, head or 0) for layer, head in
                 self.terms]
        text = [f"{'*' if star_l else layer}.{'*' if star_h else head}"
                for star_l, layer, star_h, head in sorted(items)]
        return ("head:" if len(text) == 1 else "heads:") + ",".join(text)

    def __repr__(self) -> str:
        return f"Scope({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scope) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(self.terms)

    def __reduce__(self) -> tuple:  # picklable (torch.distributed exchanges objects)
        return (_from_terms, (tuple(self.terms),))


def _from_terms(terms: tuple[Term, ...]) -> Scope:
    return Scope(terms=terms)


ScopeLike = Scope | str | Sequence[str | Scope] | None

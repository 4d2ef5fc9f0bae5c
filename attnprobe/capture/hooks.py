"""Forward hooks on named modules whose outputs are attention patterns.

This is the seam for attnprobe's reference models (``blocks.{i}.attn.hook_pattern``) and for
any other torch model whose attention weights come out of a module, e.g. TransformerLens'
``HookedTransformer`` (``blocks.{i}.attn.hook_pattern``). Returning a tensor from a forward
hook replaces the module's output, which is how edits reach the values. Hooks act only on the
forwards of the thread that opened the capture (:meth:`Recorder.opened`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from attnprobe.capture.discovery import declared_causal
from attnprobe.capture.recorder import Recorder
from attnprobe.capture.sites import Site, layer_counts, site_for_path
from attnprobe.core.hook_point import HookPoint
from attnprobe.errors import AttentionUnavailableError, InputError

PATTERN_SUFFIX = "hook_pattern"
SCORES_SUFFIX = "hook_scores"
# tensor name (parts.TENSORS) -> the hook point next to hook_pattern that carries it
SIBLINGS = {"scores": SCORES_SUFFIX, "q": "hook_q", "k": "hook_k", "v": "hook_v",
            "z": "hook_z"}


def count_hooks(model: nn.Module) -> int:
    """All forward, forward-pre and backward hooks on every module of ``model``.

    Example:
        >>> ids = lm_tok([prompt], return_tensors="pt")
        >>> with ap.capture(lm) as cap:                 # lm's hook points get hooks
        ...     during = count_hooks(lm)
        ...     _ = lm(**ids)
        >>> during > 0, count_hooks(lm)                 # and none are left after
        (True, 0)
    """
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(getattr(m, "_backward_pre_hooks", {})) for m in model.modules())


def hook_point_paths(model: nn.Module) -> list[str]:
    """Paths of ``HookPoint`` modules named ``...hook_pattern`` (reference-model convention).

    Example:
        >>> hook_point_paths(lm)                        # a 2-layer reference model
        ['blocks.0.attn.hook_pattern', 'blocks.1.attn.hook_pattern']
        >>> hook_point_paths(model)                     # a transformers model has none
        []
    """
    return [name for name, mod in model.named_modules()
            if isinstance(mod, HookPoint) and name.rsplit(".", 1)[-1] == PATTERN_SUFFIX]


def path_sites(model: nn.Module, paths: Sequence[str]) -> list[Site]:
    encdec = bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))
    sites = []
    for i, path in enumerate(paths):
        try:
            module = model.get_submodule(path)
        except AttributeError:
            raise InputError(f"no module at path {path!r} in {type(model).__name__}") from None
        site = site_for_path(path, module, encoder_decoder=encdec, fallback_layer=i,
                             root=model)
        sites.append(site)
    return sites


def _pattern_hook(recorder: Recorder, site: Site, n_heads: int | None, causal: bool
                  ) -> Callable[..., torch.Tensor | None]:
    """The hook on a site's pattern; ``causal``: the model declares causal self-attention,
    so a row sees the keys up to its own position (the weights cannot tell: a head whose
    other weights all underflow to 0 looks like one that sees a single key)."""
    causal = causal and site.kind == "self"

    def on_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        if not recorder.is_open:  # a forward of another thread: not this capture's
            return None
        if not isinstance(output, torch.Tensor) or output.ndim != 4:
            shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output)
            raise AttentionUnavailableError(
                f"output of {site.path} is not a [batch, head, query, key] pattern: {shape}")
        if recorder.knockouts:  # the model masks after hook_scores: a row may have lost all
            _check_rows_left(recorder, site, output)
        pattern = output
        if recorder.takes("pattern"):
            pattern = recorder.tensor(site, "pattern", output, n_heads or output.shape[1])
        visible = None
        if causal and pattern.shape[2] == pattern.shape[3]:
            positions = recorder.current.token_view(site.side, pattern.shape[0],
                                                    pattern.shape[2])[1]
            visible = positions.clamp(min=0) + 1  # [batch, query]
        recorder.consume(site, pattern, 0, pattern.shape[2], visible)
        return pattern if recorder.rewrites("pattern") else None

    return on_output


def _check_rows_left(recorder: Recorder, site: Site, pattern: torch.Tensor) -> None:
    """A real query row whose every key the knockouts (with the model's own mask) closed
    comes out of the softmax as NaN: an error naming it, never NaN maps."""
    broken = ~torch.isfinite(pattern).all(-1)  # [batch, head, query]
    if bool(broken.any()):
        real = recorder.query_valid(site, pattern.shape[0], pattern.shape[2])
        broken = broken & real[:, None, :].to(broken.device)
        if bool(broken.any()):
            b, h, q = broken.nonzero()[0].tolist()
            raise InputError(f"the knockout at {site.path} blocks every key query {q} of "
                             f"example {b} may read (head {h}, with the model's own mask); a "
                             "row needs a key left")


def _sibling_hook(recorder: Recorder, site: Site, name: str, n_heads: int | None
                  ) -> Callable[..., torch.Tensor | None]:
    """Forward hook on the ``hook_<name>`` next to a site's pattern (:data:`SIBLINGS`): the
    tensor to the parts that take it; for the scores, the knockouts' blocked edges closed
    (the model's own mask is applied after them)."""

    def on_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        if not recorder.is_open:
            return None
        heads = n_heads or output.shape[1]
        tensor = recorder.tensor(site, name, output, heads) if recorder.takes(name) else output
        if name == "scores" and recorder.knockouts:
            blocked = recorder.blocked(site, tensor.shape, None)
            if blocked is not None:
                return tensor.masked_fill(blocked, float("-inf"))
        return tensor if recorder.rewrites(name) else None

    return on_output


def sibling_path(model: nn.Module, pattern_path: str, name: str) -> str:
    """The ``hook_<name>`` sibling of a ``hook_pattern`` path; an error naming what needs it
    when the model has none."""
    head = pattern_path.rpartition(".")[0]
    suffix = SIBLINGS[name]
    path = f"{head}.{suffix}" if head else suffix
    try:
        model.get_submodule(path)
    except AttributeError:
        wants = "scores=True or a knockout" if name == "scores" else f"a part on {name!r}"
        raise InputError(f"{wants} needs a {suffix} module next to {pattern_path}; "
                         f"{type(model).__name__} has none at {path} (attnprobe's reference "
                         "models and transformers models serve it)") from None
    return path


def _query_heads(model: nn.Module, pattern_path: str) -> int | None:
    """Query heads of the attention module holding a hook point (its ``n_heads``)."""
    head = pattern_path.rpartition(".")[0]
    holder = model.get_submodule(head) if head else model
    n = getattr(holder, "n_heads", None)
    return n if isinstance(n, int) else None


@contextmanager
def path_seam(model: nn.Module, recorder: Recorder, paths: Sequence[str] | None
              ) -> Iterator[list[Site]]:
    """Hook each pattern-producing module, and the ``hook_<name>`` siblings the parts or
    knockouts need (``hook_scores``, ``hook_q`` ...); handles are removed even if the forward
    raises."""
    paths = list(paths) if paths is not None else hook_point_paths(model)
    if not paths:
        raise AttentionUnavailableError(
            f"cannot capture attention of {type(model).__name__}: it is not a transformers model "
            "and has no hook_pattern modules; pass paths=[...] of modules that output patterns")
    sites = path_sites(model, paths)
    causal = declared_causal(model) is True
    recorder.check_layers(layer_counts(sites))
    wanted = [s for s in sites if recorder.wants(s)]
    siblings = [name for name in SIBLINGS if recorder.takes(name)
                or (name == "scores" and recorder.knockouts)]
    handles = []
    try:
        if recorder.needs_weights:
            for site in wanted:
                n_heads = _query_heads(model, site.path)
                module = model.get_submodule(site.path)
                handles.append(module.register_forward_hook(
                    _pattern_hook(recorder, site, n_heads, causal)))
                for name in siblings:
                    sibling = model.get_submodule(sibling_path(model, site.path, name))
                    handles.append(sibling.register_forward_hook(
                        _sibling_hook(recorder, site, name, n_heads)))
        yield wanted
    finally:
        for handle in handles:
            handle.remove()

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

from attnprobe.capture.parts import Scores
from attnprobe.capture.recorder import Recorder
from attnprobe.capture.sites import Site, layer_counts, site_for_path
from attnprobe.core.hook_point import HookPoint
from attnprobe.errors import AttentionUnavailableError, InputError

PATTERN_SUFFIX = "hook_pattern"
SCORES_SUFFIX = "hook_scores"


def count_hooks(model: nn.Module) -> int:
    """All forward, forward-pre and backward hooks on every module of ``model``."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(getattr(m, "_backward_pre_hooks", {})) for m in model.modules())


def hook_point_paths(model: nn.Module) -> list[str]:
    """Paths of ``HookPoint`` modules named ``...hook_pattern`` (reference-model convention)."""
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
        site = site_for_path(path, module, encoder_decoder=encdec, fallback_layer=i)
        sites.append(site)
    return sites


def _hook(recorder: Recorder, site: Site) -> Callable[..., torch.Tensor | None]:
    def on_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        if not recorder.is_open:  # a forward of another thread: not this capture's
            return None
        if not isinstance(output, torch.Tensor) or output.ndim != 4:
            shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output)
            raise AttentionUnavailableError(
                f"output of {site.path} is not a [batch, head, query, key] pattern: {shape}")
        pattern = recorder.apply_edit(site, output) if recorder.edit is not None else output
        recorder.consume(site, pattern, 0, pattern.shape[2])
        return pattern if recorder.edit is not None else None

    return on_output


def _scores_hook(recorder: Recorder, site: Site) -> Callable[..., None]:
    def on_output(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        if recorder.is_open:
            recorder.consume_scores(site, output)

    return on_output


def scores_path(model: nn.Module, pattern_path: str) -> str:
    """The ``hook_scores`` sibling of a ``hook_pattern`` path; error if the model has none."""
    head = pattern_path.rpartition(".")[0]
    path = f"{head}.{SCORES_SUFFIX}" if head else SCORES_SUFFIX
    try:
        model.get_submodule(path)
    except AttributeError:
        raise InputError(f"scores=True needs a {SCORES_SUFFIX} module next to {pattern_path}; "
                         f"{type(model).__name__} has none at {path}") from None
    return path


@contextmanager
def path_seam(model: nn.Module, recorder: Recorder, paths: Sequence[str] | None
              ) -> Iterator[list[Site]]:
    """Hook each pattern-producing module (and, for the Scores part, its ``hook_scores``
    sibling); handles are removed even if the forward raises."""
    scores = any(isinstance(part, Scores) for part in recorder.parts)
    paths = list(paths) if paths is not None else hook_point_paths(model)
    if not paths:
        raise AttentionUnavailableError(
            f"cannot capture attention of {type(model).__name__}: it is not a transformers model "
            "and has no hook_pattern modules; pass paths=[...] of modules that output patterns")
    sites = path_sites(model, paths)
    recorder.check_layers(layer_counts(sites))
    wanted = [s for s in sites if recorder.wants(s)]
    handles = []
    try:
        if recorder.needs_weights:
            for site in wanted:
                module = model.get_submodule(site.path)
                handles.append(module.register_forward_hook(_hook(recorder, site)))
                if scores:
                    sibling = model.get_submodule(scores_path(model, site.path))
                    handles.append(sibling.register_forward_hook(_scores_hook(recorder, site)))
        yield wanted
    finally:
        for handle in handles:
            handle.remove()

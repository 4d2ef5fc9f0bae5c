"""Where a module's weights live, and reading them from there one module at a time.

A big model's weights may sit on a GPU, on the CPU, or on the ``meta`` device between forwards
(accelerate's offload hooks keep them in CPU memory or on disk and load them for the forward
only), and they may be quantized (optimum-quanto, torchao or bitsandbytes tensors). The
analyses that read weights (direct logit attribution, QK/OV circuits, composition, path
patching) go through :func:`loaded` and :func:`dequantized`, so that:

- an offloaded module's weights are loaded for the read only, by the module's own offload hook
  (``accelerate.utils.align_module_device``), and put back when the read ends: at most one
  module is materialised at a time;
- a quantized weight is dequantized to a plain tensor in the module's compute dtype (int8 weight
  ``q`` with per-row scale ``s`` becomes ``q · s``: the values the quantized forward multiplies
  by), never read as raw integers;
- nothing here moves a weight to another device: a reader moves what it keeps, and only that.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator

import torch
from torch import nn

from attnprobe.core.registry import Registry
from attnprobe.errors import InputError

__all__ = ["DEQUANTIZERS", "dequantized", "detached_copy", "execution_device", "input_device",
           "is_offloaded", "is_quantized", "kept", "loaded", "missing_weights",
           "quantized_modules"]

DEQUANTIZERS: Registry[Callable[[torch.Tensor, nn.Module | None], torch.Tensor | None]] = \
    Registry("weight dequantizer")
"""name -> ``(weight, module) -> plain tensor`` (None when the weight is not of that kind)."""


def is_offloaded(module: nn.Module) -> bool:
    """Whether an accelerate hook keeps ``module``'s own weights off its execution device
    (on ``meta`` between forwards).

    Example:
        >>> is_offloaded(model.pooler.dense)     # in memory: no offload hook keeps it away
        False
    """
    hook = getattr(module, "_hf_hook", None)
    return bool(getattr(hook, "offload", False))


def execution_device(module: nn.Module) -> torch.device:
    """The device ``module`` computes on: its accelerate hook's execution device when it has
    one, else the device of its first parameter or buffer (the CPU when it has none).

    Example:
        >>> execution_device(model.embeddings)
        device(type='cpu')
    """
    hook = getattr(module, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(device if not isinstance(device, int) else f"cuda:{device}")
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.device.type != "meta":
            return tensor.device
    return torch.device("cpu")


def input_device(model: nn.Module) -> torch.device:
    """The device ``model``'s inputs go to: the execution device of its top-level accelerate
    hook or of its input embedding (a dispatched or offloaded model, whose first parameter may
    wait on ``meta``), else the device of its first parameter that holds data.

    Raises:
        InputError: a weight is on ``meta`` with no offload hook to load it
            (:func:`missing_weights`).

    Example:
        >>> batch["input_ids"].to(input_device(model)).device   # where a batch goes
        device(type='cpu')
    """
    missing = missing_weights(model)
    if missing:
        raise InputError(f"the model's weights are on the 'meta' device (not loaded: "
                         f"{missing[0]}{' ...' if len(missing) > 1 else ''}); load or "
                         "materialise them before running it")
    if getattr(getattr(model, "_hf_hook", None), "execution_device", None) is not None:
        return execution_device(model)
    embeddings = getattr(model, "get_input_embeddings", None)
    try:
        embed = embeddings() if callable(embeddings) else None
    except NotImplementedError:
        embed = None
    if isinstance(embed, nn.Module):
        return execution_device(embed)
    return execution_device(model)


def missing_weights(model: nn.Module) -> list[str]:
    """Names of the parameters of ``model`` on ``meta`` that no offload hook loads (a
    model built without its weights).

    Example:
        >>> missing_weights(model)     # every weight present (or loadable by its hook)
        []
    """
    return [f"{name}.{key}" if name else key for name, module in model.named_modules()
            if not is_offloaded(module)
            for key, tensor in module.named_parameters(recurse=False)
            if tensor.device.type == "meta"]


@contextlib.contextmanager
def loaded(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` with its own weights in place for the duration of the block (loaded by its
    offload hook when it has one, and put back on exit, also on error).

    Raises:
        InputError: a weight of ``module`` stays on the ``meta`` device (no hook can load it).

    Example:
        >>> with loaded(model.pooler.dense) as dense:   # an offloaded module: loaded for the read
        ...     dense.weight.shape
        torch.Size([384, 384])
    """
    if not is_offloaded(module):
        _check_present(module)
        yield module
        return
    from accelerate.utils import align_module_device  # offloaded: accelerate is installed

    with align_module_device(module):
        _check_present(module)
        yield module


def kept(tensor: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """``tensor`` (read from ``module`` inside :func:`loaded`) where a reader that keeps it
    past the read should hold it: on the CPU for an offloaded module, whose execution device
    (a GPU) would otherwise hold every offloaded layer's kept weights at once, against the
    memory the user allowed; where it is for any other module.

    Example:
        >>> dense = model.pooler.dense
        >>> with loaded(dense):
        ...     weight = kept(dense.weight.detach(), dense)   # held past the read
        >>> weight.device
        device(type='cpu')
    """
    if is_offloaded(module) and tensor.device.type != "cpu":
        return tensor.to("cpu")
    return tensor


def _check_present(module: nn.Module) -> None:
    for name, tensor in (*module.named_parameters(recurse=False),
                         *module.named_buffers(recurse=False)):
        if tensor.device.type == "meta":
            raise InputError(f"{type(module).__name__}.{name} is on the 'meta' device and no "
                             "offload hook can load it; load the model with its weights "
                             "(ap.load_model(..., device_map=..., offload_folder=...))")


def dequantized(tensor: torch.Tensor, module: nn.Module | None = None) -> torch.Tensor:
    """``tensor`` as a plain tensor: dequantized by the first of :data:`DEQUANTIZERS` that
    knows it, else itself (a plain weight). Detached.

    Example:
        >>> weight = model.pooler.dense.weight
        >>> torch.equal(dequantized(weight), weight)   # a plain weight is itself, detached
        True
    """
    for read in DEQUANTIZERS.values():
        plain = read(tensor, module)
        if plain is not None:
            return plain.detach()
    return tensor.detach()


def is_quantized(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a quantized weight (a tensor subclass that dequantizes, or an
    integer-typed weight of a quantized layer).

    Example:
        >>> is_quantized(model.pooler.dense.weight)
        False
    """
    return type(tensor).__name__ in _BNB_WEIGHTS or _dequantizes(tensor)


_BNB_WEIGHTS = ("Int8Params", "Params4bit")


def _dequantizes(tensor: torch.Tensor) -> bool:
    """A tensor subclass with its own ``dequantize()`` (optimum-quanto, torchao)."""
    return type(tensor) not in (torch.Tensor, nn.Parameter) and hasattr(tensor, "dequantize")


def quantized_modules(model: nn.Module) -> list[str]:
    """Names of the modules of ``model`` whose own weight is quantized.

    Example:
        >>> quantized_modules(model)   # a load with quantization="int8" lists its Linear layers
        []
    """
    return [name for name, module in model.named_modules()
            if isinstance(getattr(module, "weight", None), torch.Tensor)
            and is_quantized(module.weight)]


def detached_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` without accelerate's hooks (whose weight maps may hold the
    whole offloaded model), to be run on probe inputs. Call it inside :func:`loaded` so the
    copy has the weights.

    Example:
        >>> norm = model.embeddings.LayerNorm
        >>> probe = detached_copy(norm).to(torch.float64)  # the model is untouched
        >>> probe is norm, norm.weight.dtype
        (False, torch.float32)
    """
    memo: dict[int, object] = {id(m._hf_hook): None for m in module.modules()
                               if hasattr(m, "_hf_hook")}
    probe = copy.deepcopy(module, memo)
    for sub in probe.modules():
        if "_hf_hook" in sub.__dict__:
            for name in ("_hf_hook", "forward", "_old_forward"):
                sub.__dict__.pop(name, None)
    return probe


@DEQUANTIZERS.register("tensor-subclass")
def _tensor_subclass(tensor: torch.Tensor, module: nn.Module | None) -> torch.Tensor | None:
    """optimum-quanto's ``QTensor`` and torchao's quantized tensors: their own
    ``dequantize()``."""
    return tensor.dequantize() if _dequantizes(tensor) else None


@DEQUANTIZERS.register("bitsandbytes")
def _bitsandbytes(tensor: torch.Tensor, module: nn.Module | None) -> torch.Tensor | None:
    """bitsandbytes' 4-bit (``Params4bit`` with its quant state) and 8-bit (``Int8Params``
    with per-row scales ``SCB``: ``w = CB · SCB / 127``) weights."""
    kind = type(tensor).__name__
    if kind == "Params4bit":
        import bitsandbytes as bnb

        return bnb.functional.dequantize_4bit(tensor.data, tensor.quant_state)
    if kind == "Int8Params":
        scale = getattr(tensor, "SCB", None)
        if scale is None and module is not None:
            scale = getattr(getattr(module, "state", None), "SCB", None)
        if scale is None:
            raise InputError("a bitsandbytes int8 weight has no scales (SCB) to dequantize "
                             "it with")
        return tensor.data.float() * scale.float()[:, None] / 127
    return None

"""Devices a model may be placed on, checked before anything is loaded: ``--device`` and each
device of a ``{module: device}`` map must exist on this machine (a GPU index below the count,
``mps`` where it is available), so a bad one is a one-line error instead of a failure deep in
accelerate's placement (:mod:`attnprobe.load_options`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnprobe.errors import InputError

__all__ = ["check_device_map", "check_exists", "offloads", "parse_device"]


def parse_device(text: str | torch.device) -> torch.device:
    """``--device`` as a :class:`torch.device` that exists here (:func:`check_exists`)."""
    try:
        device = torch.device(text)
    except (RuntimeError, TypeError):
        raise InputError(f"unknown device {str(text)!r}; use cpu, cuda, cuda:1 or mps"
                         ) from None
    check_exists(device)
    return device


def check_exists(device: torch.device) -> None:
    """Refuse, in one line, a device this machine cannot run a model on."""
    if device.type == "cuda":
        count = torch.cuda.device_count()
        index = device.index or 0
        if index >= count:
            raise InputError(f"device {str(device)!r} does not exist: this machine has {count} "
                             "CUDA device(s); use --device cpu or an index below the count")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise InputError("device 'mps' is not available on this machine; use --device cpu")
    elif device.type != "cpu":
        raise InputError(f"device {str(device)!r} cannot run a model here; use cpu, cuda, "
                         "cuda:N or mps")


def check_device_map(device_map: dict[Any, Any]) -> dict[str, Any]:
    """A ``{module: device}`` map checked like ``--device``, before accelerate reads it (it
    would fail deep in the load, or with an assertion, on a device that is not there)."""
    if not device_map:
        raise InputError("the device map names no module: give {module: device}, e.g. "
                         '{"": "cpu"} for the whole model')
    for module, where in device_map.items():
        if not isinstance(module, str):
            raise InputError(f"device map key {module!r} is not a module name (e.g. "
                             "'model.layers.0'; '' is the whole model)")
        _check_map_device(module, where)
    return device_map


def _check_map_device(module: str, where: Any) -> None:
    if where == "disk":
        return
    if isinstance(where, int) and not isinstance(where, bool):
        if where < 0:
            raise InputError(f"device map: {module!r} -> {where} is not a GPU index")
        check_exists(torch.device("cuda", where))
        return
    try:
        device = torch.device(where)
    except (RuntimeError, TypeError):
        raise InputError(f"device map: {module!r} -> {where!r} is not a device; use cpu, disk, "
                         "a GPU index, cuda:N or mps") from None
    if device.type == "meta":
        raise InputError(f"device map: {module!r} -> 'meta' would load it without its "
                         "weights; use cpu or disk (with --offload-folder)")
    check_exists(device)


def offloads(device_map: Mapping[str, Any]) -> bool:
    """Whether a map puts weights on the CPU or disk beside another device, transformers'
    test for a map optimum-quanto cannot quantize on the fly."""
    places = [str(where) for where in device_map.values()]
    return "disk" in places or (len(places) > 1 and "cpu" in places)

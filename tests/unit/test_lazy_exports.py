"""The lazily exported names of ``attnprobe.attribution`` and ``attnprobe.perturb``: a name
that equals a submodule's name would become the module once that submodule is imported
(``ap.attribution.compare(...)`` would then fail on its second use)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

import attnprobe as ap

PACKAGES = ("attnprobe.attribution", "attnprobe.perturb")


def submodules(package: types.ModuleType) -> set[str]:
    return {info.name for info in pkgutil.iter_modules(package.__path__)}


@pytest.mark.parametrize("name", PACKAGES)
def test_no_lazy_name_is_a_submodule_name(name):
    package = importlib.import_module(name)
    assert sorted(set(package._LAZY) & submodules(package)) == []
    assert set(package._LAZY.values()) <= submodules(package)
    assert package.__all__ == sorted(package._LAZY)


@pytest.mark.parametrize("name", PACKAGES)
def test_lazy_names_stay_the_same_object_after_every_submodule_is_imported(name):
    package = importlib.import_module(name)
    for sub in sorted(submodules(package)):
        importlib.import_module(f"{name}.{sub}")
    for attr, module in package._LAZY.items():
        first = getattr(package, attr)
        assert not isinstance(first, types.ModuleType), attr
        assert getattr(package, attr) is first, attr
        assert first is getattr(importlib.import_module(f"{name}.{module}"), attr), attr


def test_compare_and_run_are_functions_on_repeated_use():
    importlib.import_module("attnprobe.attribution.comparison")
    importlib.import_module("attnprobe.perturb.experiments")
    for _ in range(2):
        assert inspect.isfunction(ap.attribution.compare)
        assert inspect.isfunction(ap.perturb.run)
    assert ap.attribution.compare is ap.attribution.compare
    assert ap.perturb.run is ap.perturb.run

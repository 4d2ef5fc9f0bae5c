"""The public names of each package: none equals a submodule's name (it would be replaced by
the module once that submodule is imported), every one stays the same object after every
submodule is imported, and ``dir(attnprobe)`` lists every entry point."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

import attnprobe as ap
from tests.helpers import fresh_python

PACKAGES = ("attnprobe.attribution", "attnprobe.perturb", "attnprobe.heads",
            "attnprobe.capture", "attnprobe.report", "attnprobe.plot")


def submodules(package: types.ModuleType) -> set[str]:
    return {info.name for info in pkgutil.iter_modules(package.__path__)}


@pytest.mark.parametrize("name", PACKAGES)
def test_no_public_name_is_a_submodule_name(name):
    package = importlib.import_module(name)
    assert sorted(set(package.__all__) & submodules(package)) == []


@pytest.mark.parametrize("name", PACKAGES)
def test_public_names_stay_the_same_object_after_every_submodule_is_imported(name):
    package = importlib.import_module(name)
    before = {attr: getattr(package, attr) for attr in package.__all__}
    for sub in sorted(submodules(package)):
        importlib.import_module(f"{name}.{sub}")
    for attr, first in before.items():
        assert not isinstance(first, types.ModuleType), attr
        assert getattr(package, attr) is first, attr


def test_compare_and_run_are_functions_on_repeated_use():
    for _ in range(2):
        assert inspect.isfunction(ap.attribution.compare)
        assert inspect.isfunction(ap.perturb.run)
    assert ap.attribution.compare is ap.attribution.compare


def test_dir_lists_every_entry_point_and_on_use_packages_load_lazily():
    listed = set(dir(ap))
    for name in ("load_model", "extract", "capture", "head_stats", "perturb", "attribution",
                 "report", "plot", "heads", "models", "tasks", "Scope", "save_maps",
                 "load_maps", "AttentionMap", "Capture", "__version__", "types", "errors"):
        assert name in listed, name
    assert set(ap.__all__) <= listed
    # what __init__ imports for itself is no entry point, so tab completion does not offer it
    assert not listed & {"Any", "import_module", "_ON_USE", "loading"}
    lazy = ("attnprobe.perturb", "attnprobe.attribution", "attnprobe.report", "attnprobe.plot",
            "attnprobe.tasks", "matplotlib", "captum", "jinja2")
    code = (f"import sys, attnprobe as ap; d = dir(ap); assert 'tasks' in d and 'perturb' in d; "
            f"print([m for m in {lazy!r} if m in sys.modules])")
    assert fresh_python(code) == "[]"


def test_every_listed_name_resolves():
    for name in ap.__all__:
        assert getattr(ap, name) is not None, name
    assert ap.tasks.needle_task is not None and ap.models is not None

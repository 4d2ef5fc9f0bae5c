"""attnprobe.patch is a lazily loaded package of the public API whose experiments take the
shared corpus options with the same names, kinds and defaults."""

from __future__ import annotations

import inspect
import pkgutil

import pytest

import attnprobe as ap
from tests.helpers import fresh_python

SHARED = {"batch_size": 16, "truncation": "error", "seed": 0, "progress": False,
          "distributed": None, "metric_positions": "last", "pairs": None, "max_length": None}


@pytest.mark.parametrize("fn", [ap.patch.heads, ap.patch.path, ap.patch.attribution,
                                ap.patch.residual, ap.patch.mlp, ap.patch.run],
                         ids=lambda fn: fn.__name__)
def test_experiments_share_the_corpus_options(fn):
    params = inspect.signature(fn).parameters
    assert list(params)[:5] == ["model", "tokenizer", "clean", "corrupt", "metric"]
    for name, default in SHARED.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params[name].default == default, name
    if fn is not ap.patch.path:
        assert params["scope"].default == "all"


def test_the_package_loads_on_first_use_and_names_no_submodule():
    code = ("import sys, attnprobe as ap; assert 'patch' in dir(ap); "
            "print('attnprobe.patch' in sys.modules)")
    assert fresh_python(code) == "False"
    modules = {m.name for m in pkgutil.iter_modules(ap.patch.__path__)}
    assert not set(ap.patch.__all__) & modules
    # the documented core is registered (an invariant, not a copy of the registry)
    assert callable(ap.patch.heads) and set(ap.patch.EXPERIMENTS) >= {
        "attribution", "heads", "mlp", "path", "residual"}

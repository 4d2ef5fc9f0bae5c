"""attnprobe.patch is a lazily loaded package of the public API whose experiments take the
shared corpus options (one CorpusOptions or its keywords)."""

from __future__ import annotations

import inspect
import pkgutil

import pytest

import attnprobe as ap
from attnprobe.core.corpus_options import CORPUS_FIELDS
from tests.helpers import fresh_python


@pytest.mark.parametrize("fn", [ap.patch.heads, ap.patch.path, ap.patch.attribution,
                                ap.patch.residual, ap.patch.mlp, ap.patch.run],
                         ids=lambda fn: fn.__name__)
def test_experiments_share_the_corpus_options(fn):
    """The corpus signature plus options: one ``corpus`` object (or its keywords), never the
    corpus keywords re-listed, at most 10 parameters."""
    params = inspect.signature(fn).parameters
    assert list(params)[:5] == ["model", "tokenizer", "clean", "corrupt", "metric"]
    assert params["corpus"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["corpus"].default is None
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert not set(params) & set(CORPUS_FIELDS)
    assert len([p for p in params.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]) \
        <= 10
    if fn is ap.patch.run:  # the pair options stay run()'s own, with their defaults
        assert params["metric_positions"].default == "last" and params["pairs"].default is None


def test_the_package_loads_on_first_use_and_names_no_submodule():
    code = ("import sys, attnprobe as ap; assert 'patch' in dir(ap); "
            "print('attnprobe.patch' in sys.modules)")
    assert fresh_python(code) == "False"
    modules = {m.name for m in pkgutil.iter_modules(ap.patch.__path__)}
    assert not set(ap.patch.__all__) & modules
    # the documented core is registered (an invariant, not a copy of the registry)
    assert callable(ap.patch.heads) and set(ap.patch.EXPERIMENTS) >= {
        "attribution", "heads", "mlp", "path", "residual"}

"""An attention view or an attribution method is one module of :mod:`attnprobe.attribution`
(here a temporary folder added to that package): it is discovered, runs, and appears in the
``compare`` help (views) and in the README's generated lists."""

import importlib
import sys
from pathlib import Path

import pytest
import torch

import attnprobe as ap
import attnprobe.attribution as attribution_package
from attnprobe.attribution import METHODS, VIEWS, discover_extensions
from attnprobe.readme import render_readme
from attnprobe.readme.methods import methods_markdown
from attnprobe.readme.views import views_markdown
from tests.helpers import run_cli, tiny_bert_classifier

README = Path(__file__).resolve().parents[3] / "README.md"
VIEW, METHOD = "throwaway_first_row", "throwaway_value"
TEXT = "the cat sat on the mat"
MODULE = f'''"""A test's view and method, registered where they are written."""
from dataclasses import dataclass
from typing import ClassVar

import torch

from attnprobe.attribution.method_base import METHODS, Explanation
from attnprobe.attribution.view_base import VIEWS, View


@VIEWS.register("{VIEW}")
class FirstRow(View):
    """The first query row of the last layer, mean over its heads."""

    name = "{VIEW}"
    summary = "the first row of the last layer (a test's)"

    def importance(self, inp):
        amap = inp.amap
        row = amap.pattern[-1].double().mean(0)[0]  # [key]
        return [inp.result(row, amap.key_tokens, f"{{self.name}}@L{{amap.layers[-1]}}")]


@METHODS.register("{METHOD}")
@dataclass(frozen=True)
class Value:
    """Every token scored by the target's value (a test's method)."""

    name: ClassVar[str] = "{METHOD}"
    summary: ClassVar[str] = "the target's value on every token (a test's)"
    knob: ClassVar[str | None] = None

    def cost(self, n_tokens):
        return n_tokens

    def explain(self, problem):
        return Explanation(torch.full((problem.n_tokens,), problem.value))
'''


@pytest.fixture
def throwaway_module(tmp_path, monkeypatch):
    (tmp_path / "throwaway_extension.py").write_text(MODULE)
    monkeypatch.setattr(attribution_package, "__path__",
                        [*attribution_package.__path__, str(tmp_path)])
    monkeypatch.setenv("COLUMNS", "250")  # argparse wraps at the terminal width
    importlib.invalidate_caches()
    yield
    for registry, name in ((VIEWS, VIEW), (METHODS, METHOD)):
        if name in registry:
            registry.unregister(name)
    sys.modules.pop("attnprobe.attribution.throwaway_extension", None)


def test_a_view_and_a_method_in_one_new_module_are_discovered(throwaway_module, capsys):
    assert VIEW not in VIEWS and METHOD not in METHODS
    discover_extensions()
    assert VIEW in VIEWS and METHOD in METHODS

    model, tok = tiny_bert_classifier()
    amap = ap.extract(model, tok, TEXT)[0]
    got = ap.attribution.attention_importance(model, tok, TEXT, views=[VIEW])[0]
    torch.testing.assert_close(got.scores, amap.pattern[-1].double().mean(0)[0])

    ids = tok(TEXT, return_tensors="pt")
    with torch.no_grad():
        logit = float(model(**ids).logits[0, 1])  # class:1 is logit 1
    explained = ap.attribution.attribute(model, tok, [TEXT], "class:1", [METHOD])[0]
    assert explained.scores.tolist() == pytest.approx([logit] * ids["input_ids"].shape[1],
                                                      rel=1e-6)

    code, printed, _ = run_cli(["compare", "--help"], capsys)
    assert code == 0 and VIEW in printed

    # the lists are wrapped paragraphs: where a line breaks depends on every other entry
    assert f"`{VIEW}`: the first row of the last layer (a test's)" in \
        " ".join(views_markdown().split())
    assert f"`{METHOD}`: the target's value on every token (a test's)" in \
        " ".join(methods_markdown().split())
    readme = render_readme(README.read_text(encoding="utf-8"))
    assert f"`{VIEW}`:" in readme and f"`{METHOD}`:" in readme


def test_the_throwaway_extension_is_gone_after_the_test():
    assert VIEW not in VIEWS and METHOD not in METHODS
    assert "attnprobe.attribution.throwaway_extension" not in sys.modules


def test_every_view_and_method_says_what_it_does():
    for registry in (VIEWS, METHODS):
        for name in registry.names():
            assert getattr(registry.get(name), "summary", "").strip(), name
    assert {"raw", "rollout", "flow", "attn_x_grad", "norm"} <= set(VIEWS.names())
    assert {"integrated_gradients", "saliency", "leave_one_out"} <= set(METHODS.names())

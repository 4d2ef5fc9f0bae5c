"""The one experiment machinery (``attnprobe.core.experiments``) of perturbation and patching:
invariants over both registries, no switch on an experiment's name, and a throw-away
experiment of each family written as a module file, discovered, listed by ``--help`` and the
README generator, and run on a tiny model."""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest
import torch

import attnprobe as ap
import attnprobe.patch
import attnprobe.perturb
from attnprobe.core.corpus_options import CORPUS_FIELDS, CorpusOptions
from attnprobe.core.experiments import ExperimentRegistry
from attnprobe.core.plugins import declared_rank
from attnprobe.models import build_reference
from attnprobe.perturb import Scope, Zero, perturbed
from attnprobe.readme import render_readme
from tests.conftest import track
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[3]
FAMILIES = {"perturb": attnprobe.perturb.EXPERIMENTS, "patch": attnprobe.patch.EXPERIMENTS}
# the documented core of each family (README, DESIGN): present, whatever else is registered
CORE = {"perturb": {"permute", "dirichlet", "uniform", "ablate", "mean", "erase",
                    "adversarial", "importance", "knockout"},
        "patch": {"heads", "path", "attribution", "residual", "mlp"}}
TEXTS = ["the cat sat on the red mat", "a dog ran to the big tree"]


# ----------------------------------------------------------------------------- invariants
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_registered_experiment_is_documented_and_ranked(family):
    registry = FAMILIES[family]
    assert isinstance(registry, ExperimentRegistry)
    names = [spec.name for spec in registry.values()]
    assert len(names) == len(set(names)) == len(registry)
    assert CORE[family] <= set(names)
    ranks = [spec.rank for spec in registry.values()]
    assert ranks == sorted(ranks)
    for spec in registry.values():
        module = sys.modules[spec.fn.__module__]
        assert spec.rank == declared_rank(Path(module.__file__)), spec.name  # its RANK line
        assert spec.summary.strip() and "\n" not in spec.summary, spec.name
        for f in fields(spec.params):
            assert f.metadata["help"].strip(), (spec.name, f.name)


def test_a_summary_must_be_one_line_and_params_of_the_family():
    register = attnprobe.perturb.job.register_experiment
    with pytest.raises(TypeError, match="summary must be one non-empty line"):
        register("never", summary="two\nlines")
    with pytest.raises(TypeError, match="params must subclass"):
        register("never", attnprobe.patch.params.Params, summary="a patching class")
    assert "never" not in attnprobe.perturb.EXPERIMENTS


def _name_switches(path: Path, names: set[str]) -> list[str]:
    """``x == "name"`` / ``x != "name"`` / ``x in ("name", ...)`` comparisons in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        for op, right in zip(node.ops, node.comparators, strict=True):
            values = [right] if isinstance(op, ast.Eq | ast.NotEq) else (
                list(right.elts) if isinstance(op, ast.In | ast.NotIn)
                and isinstance(right, ast.Tuple | ast.List | ast.Set) else [])
            hits = [v.value for v in values if isinstance(v, ast.Constant) and v.value in names]
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {hit}" for hit in hits]
    return found


def test_no_code_switches_on_an_experiment_name():
    files = [*sorted((ROOT / "attnprobe/perturb").glob("*.py")),
             *sorted((ROOT / "attnprobe/patch").glob("*.py")),
             ROOT / "attnprobe/commands/perturb.py", ROOT / "attnprobe/commands/patch.py"]
    # names no other vocabulary of these folders uses ("mean", "permute" ... also name
    # interventions, "attention" a ranking): a comparison with one is a switch on the name
    names = {"path", "heads", "attribution", "residual", "ablate", "adversarial",
             "importance", "knockout"}
    assert [hit for path in files for hit in _name_switches(path, names)] == []


# ----------------------------------------------------------------------------- signatures
@pytest.mark.parametrize("fn", [ap.perturb.run, ap.perturb.knockout, ap.patch.run,
                                ap.patch.heads, ap.patch.path, ap.patch.attribution,
                                ap.patch.residual, ap.patch.mlp], ids=lambda fn: fn.__name__)
def test_corpus_functions_take_one_corpus_object_and_at_most_ten_parameters(fn):
    params = inspect.signature(fn).parameters
    named = [p for p in params.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert len(named) <= 10
    assert params["corpus"].default is None
    assert params["corpus"].kind is inspect.Parameter.KEYWORD_ONLY
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert not set(params) & set(CORPUS_FIELDS)  # never re-listed: they come in `corpus`


@pytest.fixture(scope="module")
def classifier():
    model, tok = build_reference("transformer-classifier")  # 2 layers x 2 heads
    return track(model), tok


def test_a_corpus_object_and_its_keywords_give_the_same_table(classifier):
    model, tok = classifier
    by_keywords = ap.perturb.run(model, tok, TEXTS, "permute", scope="layer:1", batch_size=3,
                                 seed=4, n_permutations=5)
    corpus = CorpusOptions(scope="layer:1", batch_size=3, seed=4)
    by_object = ap.perturb.run(model, tok, TEXTS, "permute", corpus=corpus, n_permutations=5)
    assert by_object.equals(by_keywords)
    overridden = ap.perturb.run(model, tok, TEXTS, "permute", corpus=corpus.replace(seed=9),
                                seed=4, n_permutations=5)  # a keyword overrides the object
    assert overridden.equals(by_keywords)
    with pytest.raises(ap.InputError, match="takes no budget"):
        ap.perturb.run(model, tok, TEXTS, "uniform", budget=5)
    with pytest.raises(ap.InputError, match=r"perturb\.knockout takes no option 'n_draws'"):
        ap.perturb.knockout(model, tok, TEXTS, "to:0", n_draws=3)


# ----------------------------------------------------------------------------- throw-away
PERTURB_MODULE = '''
"""A throw-away perturbation experiment: the scoped heads zeroed, through the public
helper of one-edit experiments."""

from dataclasses import dataclass

from attnprobe.perturb.edits import one_shot
from attnprobe.perturb.interventions import Zero
from attnprobe.perturb.job import register_experiment
from attnprobe.perturb.params import Params, option

RANK = 1000


@dataclass(frozen=True)
class ToyParams(Params):
    toy_level: int = option(2, "a throw-away number recorded in the table", minimum=0)


@register_experiment("toy-zero", ToyParams, summary="throw-away: the scoped heads zeroed",
                     sweeps=True)
def _toy(job):
    return one_shot(job, Zero(), job.record())
'''

PATCH_MODULE = '''
"""A throw-away patching experiment: the metric of every clean and corrupted input."""

from dataclasses import dataclass

import pandas as pd

from attnprobe.inputs.text import batch_spans
from attnprobe.patch.job import register_experiment
from attnprobe.patch.pairs import DIRECTIONS
from attnprobe.patch.params import Params, option

RANK = 1000


@dataclass(frozen=True)
class ToyParams(Params):
    direction: str = option("denoising", "denoising: the corrupted run with clean "
                            "activations (sufficiency); noising: the reverse (necessity)",
                            choices=DIRECTIONS)
    toy_note: str = option("hello", "a throw-away word recorded in the table")


@register_experiment("toy-baselines", ToyParams, summary="throw-away: each input's metric")
def _toy(job):
    found = job.baselines(batch_spans(len(job.pairs), job.batch_size), job.scope, ["pattern"])
    return pd.DataFrame({"example_id": list(job.pairs.ids), "clean": found.clean,
                         "corrupt": found.corrupt, "toy_note": job.params.toy_note})
'''


def _discovered(monkeypatch, tmp_path, package, name: str, source: str):
    """Write ``source`` as module ``name`` of a second folder of ``package`` and discover it;
    the caller unregisters what it registered."""
    folder = tmp_path / package.__name__.replace(".", "_")
    folder.mkdir()
    (folder / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    monkeypatch.delitem(sys.modules, f"{package.__name__}.{name}", raising=False)
    package.EXPERIMENTS.discover()
    return sys.modules[f"{package.__name__}.{name}"]


@pytest.fixture
def toy_perturbation(monkeypatch, tmp_path):
    _discovered(monkeypatch, tmp_path, attnprobe.perturb, "toy_perturbation", PERTURB_MODULE)
    yield attnprobe.perturb.EXPERIMENTS.get("toy-zero")
    attnprobe.perturb.EXPERIMENTS.unregister("toy-zero")
    sys.modules.pop("attnprobe.perturb.toy_perturbation", None)


@pytest.fixture
def toy_patching(monkeypatch, tmp_path):
    _discovered(monkeypatch, tmp_path, attnprobe.patch, "toy_patching", PATCH_MODULE)
    yield attnprobe.patch.EXPERIMENTS.get("toy-baselines")
    attnprobe.patch.EXPERIMENTS.unregister("toy-baselines")
    sys.modules.pop("attnprobe.patch.toy_patching", None)


def _help(command: str, capsys) -> str:
    code, printed, _ = run_cli([command, "--help"], capsys)
    assert code == 0
    return " ".join(printed.split())


def _probabilities(model, batch) -> torch.Tensor:
    return model(**batch).softmax(-1)


def test_a_perturbation_experiment_in_one_new_module(toy_perturbation, classifier, capsys):
    spec = toy_perturbation
    assert spec.rank == 1000 and spec.sweeps
    assert attnprobe.perturb.EXPERIMENTS.values()[-1] is spec  # the highest rank: listed last
    flat = _help("perturb", capsys)
    assert "toy-zero: throw-away: the scoped heads zeroed" in flat
    assert "--toy-level N toy-zero: a throw-away number recorded in the table (default 2)" \
        in flat
    assert "| `toy-zero` | throw-away: the scoped heads zeroed | `toy_level` (2; " \
           "`--toy-level`) | yes | yes |" in render_readme((ROOT / "README.md").read_text())

    model, tok = classifier
    table = ap.perturb.run(model, tok, TEXTS, "toy-zero", scope="layer:1", toy_level=3)
    tvd = table[table["metric"] == "tvd"].set_index("example_id")
    assert set(table["experiment"]) == {"toy-zero"} and set(table["perturbation"]) == {"zero"}
    assert (table["toy_level"] == 3).all() and list(tvd.index) == ["0", "1"]
    for i, text in enumerate(TEXTS):  # the distance by hand: one text, one plain forward
        batch = tok([text])
        with torch.no_grad():
            before = _probabilities(model, batch)
            with perturbed(model, Zero(), Scope.parse("layer:1")):
                after = _probabilities(model, batch)
        by_hand = 0.5 * float((before - after).abs().sum())
        # float32 probabilities: each rounds at ~6e-8; the difference of a few classes too
        assert tvd.loc[str(i), "perturbed"] == pytest.approx(by_hand, abs=1e-6)
    with pytest.raises(ap.InputError, match="experiment 'toy-zero' takes the options toy_level"):
        ap.perturb.run(model, tok, TEXTS, "toy-zero", n_draws=2)


def _logit(output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.logits


def test_a_patching_experiment_in_one_new_module(toy_patching, capsys):
    spec = toy_patching
    assert spec.rank == 1000 and attnprobe.patch.EXPERIMENTS.values()[-1] is spec
    flat = _help("patch", capsys)
    assert "toy-baselines: throw-away: each input's metric" in flat
    assert "--toy-note SPEC toy-baselines: a throw-away word recorded in the table " \
           "(default hello)" in flat
    assert "| `toy-baselines` | throw-away: each input's metric | `direction` (denoising; " \
           "`--direction`), `toy_note` (hello; `--toy-note`) |" \
        in render_readme((ROOT / "README.md").read_text())

    model, tok = ap.load_model("ref:llama")
    track(model)
    clean, corrupt = [[5, 9, 12, 7, 20], [6, 8, 30, 7, 11]], [[5, 9, 13, 7, 20], [6, 40, 30, 7, 11]]
    token = 17

    def metric(output, batch):
        return _logit(output)[:, -1, token]

    table = ap.patch.run(model, tok, clean, corrupt, metric, "toy-baselines", toy_note="hi")
    assert list(table["example_id"]) == ["0", "1"] and set(table["toy_note"]) == {"hi"}
    with torch.no_grad():  # each input alone, one plain forward
        for side, rows in (("clean", clean), ("corrupt", corrupt)):
            for i, row in enumerate(rows):
                ids = torch.tensor([row])
                logits = _logit(model(input_ids=ids, attention_mask=torch.ones_like(ids)))
                # float32 logits of two batchings: ~1e-6 relative, never more than 1e-5
                assert table[side][i] == pytest.approx(float(logits[0, -1, token]), rel=1e-5,
                                                       abs=1e-5)

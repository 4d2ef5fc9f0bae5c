"""One parameter dataclass per experiment drives run()'s checks, the CLI flags and the recorded
``params``; a new experiment is one file (its function and its dataclass)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import FrozenInstanceError, dataclass, fields
from pathlib import Path

import pandas as pd
import pytest

from attnprobe.core.options import cli_options, option_flag
from attnprobe.errors import InputError
from attnprobe.models import build_reference
from attnprobe.perturb import EXPERIMENTS, Params, params_of, run
from attnprobe.perturb.experiments import reads_target
from attnprobe.perturb.params import option
from tests.conftest import track

TEXTS = ["the cat sat on the red mat", "a dog ran to the big tree"]
ROOT = Path(__file__).parents[3]


@pytest.fixture(scope="module")
def classifier():
    model, tok = build_reference("transformer-classifier")
    return track(model), tok


def test_every_experiment_has_a_frozen_dataclass_with_help_and_bounded_numbers():
    for name in EXPERIMENTS.names():
        cls = params_of(name)
        assert issubclass(cls, Params), name
        instance = cls()
        for f in fields(cls):
            assert f.metadata["help"], (name, f.name)
            with pytest.raises(FrozenInstanceError):
                setattr(instance, f.name, f.default)
            if isinstance(f.default, (int, float)) and f.metadata["minimum"] is not None:
                assert f.default >= f.metadata["minimum"], (name, f.name)


def test_no_option_name_means_two_things():
    """One flag per name: the same name has the same type, bounds and flag everywhere."""
    options = cli_options({name: params_of(name) for name in EXPERIMENTS.names()})
    flags = [o.flag for o in options]
    assert len(flags) == len(set(flags))
    assert "k" not in {o.name for o in options}  # erase's count is max_erased
    owners = {o.flag: o.experiments for o in options}
    assert owners["--permutations"] == ("permute",) and owners["--draws"] == ("dirichlet",)
    assert owners["--max-erased"] == ("erase",) and owners["--eps"] == ("adversarial",)


def test_options_that_share_a_name_share_a_flag_and_conflicts_are_refused():
    @dataclass(frozen=True)
    class A(Params):
        steps: int = option(3, "steps of A", minimum=1)

    @dataclass(frozen=True)
    class B(Params):
        steps: int = option(5, "steps of B", minimum=1)
        rate: float = option(0.5, "a rate", minimum=0, strict=True)

    @dataclass(frozen=True)
    class C(Params):
        steps: float = option(1.0, "steps, but a float", minimum=0)

    (steps, rate) = cli_options({"a": A, "b": B})
    assert steps.flag == "--steps" and steps.experiments == ("a", "b")
    assert steps.help == "a/b: steps of A; steps of B (default 3)"
    assert rate.experiments == ("b",) and rate.parse("0.25") == 0.25
    with pytest.raises(InputError, match=r"rate must be a finite number > 0; got 0\.0"):
        rate.parse("0")
    with pytest.raises(TypeError, match="'steps' differs between a and c"):
        cli_options({"a": A, "c": C})


def test_an_option_may_not_take_a_shared_name():
    from attnprobe.perturb.job import register_experiment

    @dataclass(frozen=True)
    class Seeded(Params):
        seed: int = option(0, "a second seed", minimum=0)

    with pytest.raises(TypeError, match=r"'clash': options \['seed'\] are shared run\(\) keywords"):
        register_experiment("clash", Seeded, summary="never registered")
    assert "clash" not in EXPERIMENTS


def test_checks_come_from_the_dataclass(classifier):
    model, tok = classifier
    with pytest.raises(InputError, match=r"^experiment 'uniform' takes no options of its own"
                                         r" \(and the shared ones: scope, batch_size, "
                                         r"truncation, seed, progress, output, target, "
                                         r".*\); got eps, k$"):
        run(model, tok, TEXTS, "uniform", eps=0.5, k=7)
    with pytest.raises(InputError, match=r"'adversarial' takes the options eps, n_adversaries,"
                                         r" steps, lr .*; got n_steps$"):
        run(model, tok, TEXTS, "adversarial", n_steps=3)
    params = params_of("importance")
    assert params(prune_steps=None).prune_steps is None  # optional
    with pytest.raises(InputError, match=r"prune_steps must be an integer >= 1; got 1\.5"):
        params(prune_steps=1.5)
    assert params_of("erase")(rankings="random").rankings == ("random",)  # one name


@pytest.mark.parametrize(("experiment", "options"), [
    ("permute", {"n_permutations": 3}),
    ("dirichlet", {"n_draws": 2, "alpha": 2.0}),
    ("erase", {"max_erased": 1, "rankings": ["attention", "integrated_gradients"],
               "n_steps": 4}),
    ("adversarial", {"eps": 0.2, "n_adversaries": 1, "steps": 2, "lr": 0.1}),
    ("importance", {"prune_steps": 2}),
    ("uniform", {}),
])
def test_the_parameter_columns_record_the_dataclass(classifier, experiment, options):
    model, tok = classifier
    table = run(model, tok, TEXTS[:1], experiment, seed=4, **options)
    cls = params_of(experiment)
    expected = cls(**options).record()
    if cls.seeded:
        expected["seed"] = 4
    expected.pop("rankings", None)  # erase: each row names its own ranking
    for name, value in expected.items():  # one column per option, in declaration order
        column = table[name]
        if value is None:
            assert column.isna().all(), name
        else:
            assert column.tolist() == [value] * len(table), name
    names = [f.name for f in fields(cls) if f.name != "rankings"]
    assert [c for c in table.columns if c in names] == names  # every option, also defaults


# ----------------------------------------------------------------------------- no silent option
# Every experiment x option pair either changes the run or is refused (issue 17): `perturb
# --experiment uniform --target class:0` measured the whole output without a word.
@pytest.mark.parametrize(("experiment", "options"), [
    ("permute", {}), ("dirichlet", {}), ("uniform", {}), ("ablate", {}), ("mean", {}),
    ("adversarial", {}), ("erase", {"rankings": ["attention", "random"]}),
])
def test_a_target_the_experiment_does_not_read_is_refused(classifier, experiment, options):
    model, tok = classifier
    with pytest.raises(InputError, match=rf"^perturb {experiment} does not read target "
                                         r"'class:0': .* \(target is read by erase, "
                                         r"importance\); leave it out$"):
        run(model, tok, TEXTS[:1], experiment, target="class:0", **options)
    assert not reads_target(experiment, **options)


def test_experiments_that_read_the_target_use_it(classifier):
    model, tok = classifier
    assert reads_target("importance") and reads_target("erase")
    assert reads_target("erase", rankings=["attention", "saliency"])
    assert not reads_target("erase", rankings="random")
    # importance: the loss is -target, so the target changes the importances
    by_class = [run(model, tok, TEXTS, "importance", target=f"class:{k}") for k in (0, 1)]
    importance = [t[t["metric"] == "importance_raw"]["perturbed"].tolist() for t in by_class]
    assert importance[0] != pytest.approx(importance[1])


def test_an_option_that_changes_nothing_is_refused(classifier):
    model, tok = classifier
    # n_steps counts Integrated Gradients steps: without that ranking it did nothing
    with pytest.raises(InputError, match=r"^experiment 'erase': n_steps changes nothing here "
                                         r"\(no ranking of attention, random takes steps; "
                                         r"integrated_gradients does\); leave it out$"):
        run(model, tok, TEXTS[:1], "erase", rankings=["attention", "random"], n_steps=10)
    params_of("erase")(rankings=["attention"], n_steps=10)  # the default object is fine
    table = run(model, tok, TEXTS[:1], "erase", rankings=["attention"])  # not given: fine
    assert set(table["n_steps"]) == {50}


NEW_EXPERIMENT = '''
"""A new experiment in one file: its parameter dataclass and its function."""
from dataclasses import dataclass

from attnprobe.perturb.interventions import Zero
from attnprobe.perturb.job import Job, Row, register_experiment
from attnprobe.perturb.params import Params, option


@dataclass(frozen=True)
class HalfParams(Params):
    share: float = option(0.5, "share of the weight kept", minimum=0, strict=True)


@register_experiment("half", HalfParams, summary="the weight scaled to a share")
def half(job: Job) -> list[Row]:
    return [Row("zero", job.record(), str(job.scope), str(i), None, "share", 0.0,
                job.params.share) for i, _ in job.examples()]
'''

SCRIPT = '''
import json, sys
sys.path.insert(0, sys.argv[1])
import half_experiment  # noqa: F401  the one file
from attnprobe.cli import main
from attnprobe.models import build_reference
from attnprobe.perturb import run

model, tok = build_reference("transformer-classifier")
table = run(model, tok, ["the cat sat", "a dog"], "half", share=0.25)
print(json.dumps(table["perturbed"].tolist()))
print(json.dumps(table["share"].tolist()))
try:
    run(model, tok, ["the cat"], "half", share=0)
except Exception as exc:
    print(type(exc).__name__, exc)
sys.exit(main(["perturb", "--model", "ref:transformer-classifier", "--text", "the cat",
               "--experiment", "half", "--share", "0.75", "--quiet", "--out", sys.argv[2]]))
'''


def test_a_new_experiment_is_one_file_with_its_api_checks_and_cli_flag(tmp_path):
    (tmp_path / "half_experiment.py").write_text(textwrap.dedent(NEW_EXPERIMENT))
    out = tmp_path / "half.csv"
    found = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(out)],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert found.returncode == 0, found.stderr
    values, params, error = found.stdout.strip().splitlines()[:3]
    assert json.loads(values) == [0.25, 0.25]
    assert json.loads(params) == [0.25, 0.25]  # the option is a column
    assert error == "InputError share must be a finite number > 0; got 0"
    written = pd.read_csv(out)
    assert written["perturbed"].tolist() == [0.75]
    assert written["share"].tolist() == [0.75]


def test_option_flags_default_to_the_name_with_dashes():
    assert option_flag("prune_steps", {"flag": None}) == "--prune-steps"
    assert option_flag("n_permutations", {"flag": "--permutations"}) == "--permutations"

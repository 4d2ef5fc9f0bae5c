"""The shared machinery of experiment options: one declaration per option gives its checks,
its flag (one per name, over every experiment of a family) and its parser."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from attnprobe.core.options import Options, cli_options, kinds, option, registered_options
from attnprobe.errors import InputError


@dataclass(frozen=True)
class Numbers(Options):
    steps: int = option(3, "steps", minimum=1)
    rate: float | None = option(None, "a rate", minimum=0, strict=True)


@dataclass(frozen=True)
class Named(Options):
    supported = (str,)
    colour: str = option("red", "a colour")


def test_numbers_are_checked_and_floats_kept_as_floats():
    assert Numbers(steps=2, rate=1).rate == 1.0 and isinstance(Numbers(rate=1).rate, float)
    assert Numbers().rate is None  # optional
    with pytest.raises(InputError, match=r"steps must be an integer >= 1; got 0"):
        Numbers(steps=0)
    with pytest.raises(InputError, match=r"rate must be a finite number > 0; got 0"):
        Numbers(rate=0)


def test_an_unsupported_type_is_refused_naming_what_the_family_takes():
    @dataclass(frozen=True)
    class Counted(Options):
        supported = (str, tuple)
        n: int = option(1, "a count")

    with pytest.raises(TypeError, match=r"Counted\.n: .* not supported \(str, "
                                        r"tuple\[str, \.\.\.\], optionally \| None\)"):
        kinds(Counted)


def test_an_unknown_option_names_the_experiment_and_what_it_takes():
    with pytest.raises(InputError, match=r"^experiment 'count' takes the options steps, rate "
                                         r"\(and the shared ones: scope\); got size$"):
        Numbers.build("count", {"size": 3}, ("scope",))
    assert Numbers.build("count", {"steps": 4}).steps == 4


def test_a_flag_parses_its_text_with_the_checks_of_run():
    (steps, rate) = cli_options({"count": Numbers})
    assert steps.flag == "--steps" and steps.metavar == "N" and rate.metavar == "X"
    assert steps.parse("5") == 5 and rate.parse("0.5") == 0.5
    assert steps.help == "count: steps (default 3)" and rate.help.endswith("(default none)")
    with pytest.raises(InputError, match=r"^expected a whole number; got '2\.5'$"):
        steps.parse("2.5")
    with pytest.raises(InputError, match=r"rate must be a finite number > 0"):
        rate.parse("-1")


def test_a_help_that_names_its_experiment_is_refused():
    """--help adds the experiments that take an option: "path: path: ..." before."""
    @dataclass(frozen=True)
    class Path(Options):
        receivers: str = option("all", "path: the receiver heads")

    with pytest.raises(TypeError, match=r"path: the help of option 'receivers' starts with"):
        cli_options({"path": Path})
    assert cli_options({"other": Path})[0].help == "other: path: the receiver heads (default all)"


def test_a_registry_gives_the_flags_of_all_its_experiments():
    @dataclass
    class Spec:
        name: str
        params: type[Options]

    found = registered_options([Spec("count", Numbers), Spec("paint", Named)])
    assert [(o.flag, o.experiments) for o in found] == [
        ("--steps", ("count",)), ("--rate", ("count",)), ("--colour", ("paint",))]
    assert found[2].metavar == "SPEC"

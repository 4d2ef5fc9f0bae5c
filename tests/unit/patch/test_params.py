"""The parameter dataclasses of the patching experiments: one declaration gives the checks of
``run()`` and the flags of ``attnprobe patch``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import attnprobe as ap
from attnprobe.core.options import cli_options
from attnprobe.patch.params import Params, option


@dataclass(frozen=True)
class Colours(Params):
    colour: str = option("red", "a colour", choices=("red", "blue"))
    shades: tuple[str, ...] = option(("light",), "shades", choices=("light", "dark"))
    where: str | None = option(None, "a scope")


@dataclass(frozen=True)
class Other(Params):
    colour: str = option("blue", "the same colour", choices=("red", "blue"))


@dataclass(frozen=True)
class Clash(Params):
    colour: str = option("red", "another colour", choices=("red", "green"))


def test_values_are_checked_against_their_choices():
    assert Colours(shades="dark,light").shades == ("dark", "light")
    assert Colours(shades=["dark"]).shades == ("dark",)
    with pytest.raises(ap.InputError, match="unknown colour 'green'; choose one of 'red'"):
        Colours(colour="green")
    with pytest.raises(ap.InputError, match="each at most once"):
        Colours(shades=("dark", "dark"))
    with pytest.raises(ap.InputError, match="must be a name"):
        Colours(colour="")
    assert Colours(where="layer:1").where == "layer:1" and Colours().where is None


def test_an_option_of_no_experiment_names_what_it_takes():
    with pytest.raises(ap.InputError, match=r"'colours' takes the options colour, shades, "
                                            r"where \(and the shared ones: scope\); got size"):
        Colours.build("colours", {"size": 3}, ("scope",))


def test_one_flag_per_option_name_shared_by_the_experiments_that_take_it():
    options = {o.name: o for o in cli_options({"a": Colours, "b": Other})}
    assert options["colour"].experiments == ("a", "b")
    assert options["colour"].flag == "--colour" and options["colour"].metavar == "red|blue"
    assert options["shades"].parse("dark,light") == ("dark", "light")
    with pytest.raises(ap.InputError):
        options["colour"].parse("green")
    with pytest.raises(TypeError, match="one name, one meaning"):
        cli_options({"a": Colours, "c": Clash})


def test_every_registered_experiment_has_flags():
    flags = {o.flag for o in cli_options({n: ap.patch.params_of(n)
                                          for n in ap.patch.EXPERIMENTS.names()})}
    assert {"--site", "--positions", "--direction", "--per", "--senders", "--receivers",
            "--into"} <= flags
    with pytest.raises(ap.InputError, match="unknown patching experiment"):
        ap.patch.params_of("knockout")

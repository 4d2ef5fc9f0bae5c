"""A label rule is one module: written in :mod:`attnprobe.heads.rules` (here a temporary
folder added to that package), it is discovered with its threshold, labels heads, takes a
user's threshold by name and appears in the README's generated precedence sentence."""

import importlib
import sys
from pathlib import Path

import pandas as pd
import pytest

import attnprobe.heads.rules as rules_package
from attnprobe.errors import InputError
from attnprobe.heads.labels import RULES, Thresholds, classify_scores, discover_rules
from attnprobe.readme import render_readme
from attnprobe.readme.labels import labels_markdown, precedence_sentence

README = Path(__file__).resolve().parents[3] / "README.md"
LABEL = "throwaway_tilted"
MODULE = f'''"""A test's label: a head whose 'tilt' score is over its own threshold."""
from attnprobe.heads.label_rules import Threshold, rule, score_of

TILT = Threshold("throwaway_tilt", 0.5, "{LABEL}: tilt above this")


@rule("{LABEL}", rank=25, family="tilts", colour="#123456", thresholds=(TILT,),
      help="tilt > {{throwaway_tilt}}")
def tilted(row, t):
    value = score_of(row, "tilt")
    if value is None or value <= t.throwaway_tilt:
        return None
    return f"tilt={{value:g}} > {{t.throwaway_tilt:g}}"
'''


def head(index, **scores):
    return {"stack": "encoder", "kind": "self", "layer": 0, "head": index,
            "head_id": f"L0H{index}", **scores}


@pytest.fixture
def throwaway_rule(tmp_path, monkeypatch):
    (tmp_path / f"{LABEL}.py").write_text(MODULE)
    monkeypatch.setattr(rules_package, "__path__", [*rules_package.__path__, str(tmp_path)])
    importlib.invalidate_caches()
    yield
    if LABEL in RULES:
        RULES.remove(LABEL)
    sys.modules.pop(f"attnprobe.heads.rules.{LABEL}", None)


def test_a_rule_with_its_own_threshold_is_one_discovered_module(throwaway_rule):
    assert LABEL not in RULES
    with pytest.raises(InputError, match="unknown threshold 'throwaway_tilt'"):
        Thresholds(throwaway_tilt=0.7)  # nothing declares it yet
    discover_rules()
    assert LABEL in RULES
    assert RULES.precedence()[:3] == ("previous", LABEL, "next")  # rank 25: after 20, before 30
    assert RULES.thresholds()["throwaway_tilt"].default == 0.5

    table = pd.DataFrame([head(0, tilt=0.6), head(1, tilt=0.4), head(2, tilt=0.9)])
    out = classify_scores(table)
    assert list(out["label"]) == [LABEL, "heterogeneous", LABEL]
    assert list(out["family"]) == ["tilts", "heterogeneous", "tilts"]
    assert out["evidence"][0] == "tilt=0.6 > 0.5"

    stricter = classify_scores(table, Thresholds(throwaway_tilt=0.7))  # overridden by name
    assert list(stricter["label"]) == ["heterogeneous", "heterogeneous", LABEL]
    assert stricter["evidence"][2] == "tilt=0.9 > 0.7"

    sentence = precedence_sentence()
    assert f"> `{LABEL}` (tilt > 0.5) > `next`" in sentence
    assert "| `throwaway_tilt` | 0.5 | `throwaway_tilted` |" in labels_markdown()
    assert sentence in render_readme(README.read_text(encoding="utf-8"))


def test_the_throwaway_rule_is_gone_after_the_test():
    assert LABEL not in RULES and "throwaway_tilt" not in RULES.thresholds()
    assert not any(name.endswith(LABEL) for name in sys.modules)

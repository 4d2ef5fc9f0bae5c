"""Metric kinds are registry entries, one module each in ``attnprobe.core.metric_kinds``: the
parser, the ``--metric`` help of ``attnprobe patch`` / ``perturb`` and the README's metric
table follow the registry, and a new kind is one module (here written into a temporary
folder) usable from the command line."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import attnprobe as ap
import attnprobe.core.metric_kinds as kinds_package
from attnprobe.core.metric import default_positions, parse_metric, reads_next_token
from attnprobe.core.metric_kind import METRIC_KINDS, kind_of, metric_help, metric_kinds
from attnprobe.core.plugins import import_modules
from attnprobe.errors import InputError
from attnprobe.readme import render_readme
from tests.helpers import run_cli

README = Path(__file__).resolve().parents[3] / "README.md"
DOCUMENTED_CORE = ("logit", "prob", "logprob", "logit_diff", "loss", "next-token")


@pytest.fixture(scope="module")
def induction():
    return ap.load_model("ref:induction")


def test_every_kind_is_one_entry_with_help_forms_and_an_example(induction):
    _, tok = induction
    found = metric_kinds()
    names = [kind.name for kind in found]
    assert set(DOCUMENTED_CORE) <= set(names) and len(set(names)) == len(names)
    ranks = [kind.rank for kind in found]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    for kind in found:
        assert kind.help.strip() and kind.forms, kind.name
        assert all(form.split(":")[0] == kind.name for form in (*kind.forms, kind.example))
        assert parse_metric(kind.example, tok).spec.startswith(kind.name)  # the example works


def test_the_kinds_package_keeps_no_import_list_and_modules_declare_ranks():
    source = Path(kinds_package.__file__).read_text()
    assert "from attnprobe" not in source and "import attnprobe" not in source
    modules = import_modules("attnprobe.core.metric_kinds")
    assert all(isinstance(module.RANK, int) for module in modules)


def test_reading_the_next_token_is_a_property_of_the_kind():
    assert reads_next_token("loss") and reads_next_token("logit:next")
    assert reads_next_token(" Prob : next ")  # kinds are read case-insensitively, stripped
    assert not reads_next_token("logit:t05") and not reads_next_token("next-token")
    assert not reads_next_token("nosuchkind:next")
    assert default_positions("logprob:next") == "all" and default_positions("loss") == "all"
    assert kind_of("logit_diff: a, b")[0] is METRIC_KINDS.get("logit_diff")


def test_pairs_go_only_to_a_kind_that_takes_them(induction):
    _, tok = induction
    with pytest.raises(InputError, match=r"^metric logit takes no pairs=; pairs are for "
                                         r"logit_diff$"):
        parse_metric("logit", tok, pairs=[("t05", "t11")])


@pytest.mark.parametrize("command", ["patch", "perturb", "report"])
def test_metric_help_lists_every_form_of_every_kind(capsys, command):
    code, printed, _ = run_cli([command, "--help"], capsys)
    assert code == 0
    flat = "".join(printed.split())  # argparse wraps lines, also at the hyphen of next-token
    for kind in metric_kinds():
        for form in kind.forms:
            assert form in flat, (command, form)


def test_the_readme_metric_table_is_the_registry():
    from attnprobe.readme.metrics import PART

    table = PART.markdown()
    for kind in metric_kinds():
        assert f"| {kind.help} | `{kind.example}` |" in table
    assert table in README.read_text(encoding="utf-8")


# ---- a throw-away kind, written as a module file -------------------------------------------

NAME = "neglogit"
MODULE = '''"""A test's metric kind: minus one token's logit at the chosen positions."""
from attnprobe.core.metric_base import Metric
from attnprobe.core.metric_build import one_token
from attnprobe.core.metric_kind import MetricKind, metric_kind
from attnprobe.core.metric_reading import logits_of
from attnprobe.core.positions import positions_mask

RANK = 95


def build(argument, tokenizer, positions, n):
    found = one_token(argument, tokenizer, f"neglogit:{argument.strip()}")

    def fn(output, batch):
        logits = logits_of(output, "neglogit").float()          # [batch, seq, vocab]
        mask = positions_mask(positions, batch).to(logits.dtype)  # [batch, seq]
        return -(logits[..., found.id] * mask).sum(-1) / mask.sum(-1)

    return Metric(f"neglogit:{found.shown}", fn, tokens=(found,))


metric_kind(MetricKind("neglogit", build, forms=("neglogit:T",),
                       help="minus token T's logit (a test's)", example="neglogit:t05",
                       rank=RANK))
'''


@pytest.fixture
def throwaway_kind(tmp_path, monkeypatch):
    (tmp_path / f"{NAME}.py").write_text(MODULE)
    monkeypatch.setattr(kinds_package, "__path__", [*kinds_package.__path__, str(tmp_path)])
    importlib.invalidate_caches()
    yield
    if NAME in METRIC_KINDS:
        METRIC_KINDS.unregister(NAME)
    sys.modules.pop(f"attnprobe.core.metric_kinds.{NAME}", None)


CLEAN = "t01 t02 t03 t04 t05 t01 t02 t03 t04"
CORRUPT = "t09 t08 t07 t06 t05 t01 t02 t03 t04"


def last_logit(model, tok, text: str, token: str) -> float:
    """The logit of ``token`` (its id read from the vocabulary) at the text's last position,
    from one plain forward."""
    ids = tok([text], return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids)  # [1, seq, vocab]
    return float(logits[0, -1, tok.get_vocab()[token]])


def test_a_new_kind_is_one_module_usable_from_the_command_line(throwaway_kind, tmp_path,
                                                                capsys, induction):
    assert NAME not in METRIC_KINDS  # nothing registers it but discovery
    code, printed, _ = run_cli(["patch", "--help"], capsys)
    assert code == 0 and "neglogit:T" in "".join(printed.split())
    assert "neglogit:T" in metric_help()

    out = tmp_path / "heads.csv"
    code, _, err = run_cli(["patch", "--model", "ref:induction", "--experiment", "heads",
                            "--clean", CLEAN, "--corrupt", CORRUPT, "--metric", "neglogit:t05",
                            "--scope", "layer:1", "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert set(table["metric"]) == {"neglogit:t05"}
    model, tok = induction
    want = [-last_logit(model, tok, CLEAN, "t05"), -last_logit(model, tok, CORRUPT, "t05")]
    assert want[0] != want[1]  # the two runs differ: the columns are not a constant
    # the same float32 forward on both sides: equal to float32 rounding of the logits
    scale = max(abs(w) for w in want)
    np.testing.assert_allclose(table[["clean", "corrupt"]].to_numpy(),
                               np.tile(want, (len(table), 1)),
                               rtol=0, atol=8 * np.finfo(np.float32).eps * scale)

    from attnprobe.readme.metrics import PART
    row = "| `neglogit:T` | minus token T's logit (a test's) | `neglogit:t05` |"
    assert row in PART.markdown()
    assert row in render_readme(README.read_text(encoding="utf-8"))


def test_the_throwaway_kind_is_gone_after_the_test():
    assert NAME not in METRIC_KINDS
    assert "neglogit" not in metric_help()

"""The census statistics are discovered: every module of ``attnprobe.heads.stats`` is imported
in the order of its declared ``RANK``, so a new score is one module there (plus its test)."""

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import attnprobe as ap
import attnprobe.heads.stats as stats_package
from attnprobe.core.plugins import declared_rank, import_modules
from attnprobe.heads.stats import SCORES, STATS, discover_stats, score_columns
from attnprobe.readme import render_readme
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert

README = Path(__file__).resolve().parents[3] / "README.md"
DOCUMENTED_CORE = ("rows", "offsets", "sinks", "classes", "copies", "segments")


def stat_modules():
    return import_modules("attnprobe.heads.stats", skip=("base",))


def test_every_stat_module_declares_its_rank_and_they_import_in_that_order():
    modules = stat_modules()
    ranks = [module.RANK for module in modules]  # every module declares one
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    names = [module.__name__.rsplit(".", 1)[1] for module in modules]
    core = [name for name in names if name in DOCUMENTED_CORE]
    assert core == list(DOCUMENTED_CORE)  # the tally's statistic order of the census


def test_the_registry_order_is_the_module_order():
    order = [module.__name__ for module in stat_modules()]
    homes = [type(stat).__module__ for stat in STATS.values()]
    assert homes == sorted(homes, key=order.index)


def test_the_stats_package_keeps_no_import_list():
    source = Path(stats_package.__file__).read_text()
    assert "from attnprobe.heads.stats import" not in source


# ---- a throw-away statistic, written as a module file ------------------------------------

NAME = "throwaway_last"
MODULE = f'''"""A test's statistic: the mass each row gives the last real key."""
from typing import ClassVar

from attnprobe.heads.stats.base import STATS, Column, Stat, register_means

RANK = 65


class LastKey(Stat):
    group: ClassVar[str] = "{NAME}"
    columns: ClassVar[tuple[Column, ...]] = (Column("{NAME}", "mass on the last real key"),)

    def __call__(self, tile):
        block = tile.block
        last = (block.key_pos == (block.key_len[:, None] - 1)).to(tile.device)  # [batch, key]
        return {{"{NAME}": tile.row_sum((tile.a * last[:, None, None, :]).sum(-1))}}


STATS.register("{NAME}")(LastKey())
register_means("{NAME}", ("{NAME}",), "mass each row gives the last real key (a test's)", 965)
'''


@pytest.fixture
def throwaway_stat(tmp_path, monkeypatch):
    (tmp_path / f"{NAME}.py").write_text(MODULE)
    monkeypatch.setattr(stats_package, "__path__", [*stats_package.__path__, str(tmp_path)])
    importlib.invalidate_caches()
    yield tmp_path / f"{NAME}.py"
    for registry in (STATS, SCORES):
        if NAME in registry:
            registry.unregister(NAME)
    sys.modules.pop(f"attnprobe.heads.stats.{NAME}", None)


def last_key_means(maps):
    """Mean over every query row of the mass on the last key, per (layer, head), straight
    from the stored (padding-free) maps."""
    sums, rows = 0.0, 0
    for amap in maps:
        pattern = amap.pattern.double()  # [layer, head, query, key]
        sums = sums + pattern[..., -1].sum(-1)
        rows += pattern.shape[2]
    return sums / rows


def test_a_new_score_is_one_module_discovered_into_the_census_and_the_readme(throwaway_stat):
    assert declared_rank(throwaway_stat) == 65
    assert NAME not in STATS  # nothing registers it but discovery
    discover_stats()
    assert NAME in STATS and NAME in score_columns()

    vocab = bert_vocab()
    model, tok = tiny_bert(vocab, "eager"), bert_tokenizer(vocab)
    texts = ["the cat sat on a mat", "a dog ran", "the big red dog sat on the cat"]
    table = ap.heads.census(model, tok, texts, similarity=False, repeated=False).scores()
    want = last_key_means(ap.extract(model, tok, texts))  # [layer, head]
    got = np.array([want[int(layer), int(head)] for layer, head
                    in zip(table["layer"], table["head"], strict=True)])
    # float32 weights summed in float64 on both sides: they agree to float32 rounding
    np.testing.assert_allclose(table[NAME].to_numpy(), got,
                               rtol=8 * np.finfo(np.float32).eps)
    assert not np.allclose(got, got[0])  # heads differ: the column is not a constant

    from attnprobe.readme.scores import PART
    row = "| `throwaway_last` | mass each row gives the last real key (a test's) |"
    assert row in PART.markdown()
    assert row in render_readme(README.read_text())


def test_the_throwaway_statistic_is_gone_after_the_test():
    assert NAME not in STATS and NAME not in SCORES
    assert torch.is_tensor(torch.zeros(1))  # the module list is back to the package's own
    assert all(not name.endswith(NAME) for name in sys.modules)

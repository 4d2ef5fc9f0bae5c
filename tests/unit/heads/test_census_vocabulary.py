"""One meaning per word in the census: a capture *part* (``attnprobe.capture.parts``) is the
only "part"; what a batch sums is a ``CensusSums``, a statistic's family a *group*."""

import dataclasses
import importlib

import pytest
import torch

from attnprobe.core.row_blocks import RowBlock
from attnprobe.heads.census_stats import CensusStats, stat_groups
from attnprobe.heads.head_census import Census
from attnprobe.heads.stats import STATS


def test_what_a_batch_sums_is_census_sums():
    sums = importlib.import_module("attnprobe.heads.census_sums")
    assert {"CensusSums", "StackedSums"} <= set(sums.__all__)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("attnprobe.heads.census_parts")
    fields = {f.name: f.type for f in dataclasses.fields(Census)}
    assert "part" not in fields and fields["sums"] in ("CensusSums", sums.CensusSums)


def test_statistics_belong_to_groups():
    groups = stat_groups()
    assert groups == frozenset(stat.group for stat in STATS.values())
    assert all(stat.group for stat in STATS.values())
    assert not any(hasattr(stat, "part") for stat in STATS.values())


def test_a_census_reducer_asks_for_groups():
    a = torch.full((1, 1, 3, 3), 1 / 3)
    pos = torch.arange(3)[None]
    block = RowBlock(a, torch.ones(1, 3, dtype=torch.bool), pos, pos, torch.tensor([3]))
    sums = CensusStats(groups=frozenset({"rows"}))(block)
    assert sums["max_weight"].item() == pytest.approx(1.0)  # three rows of max 1/3
    with pytest.raises(TypeError):
        CensusStats(parts=frozenset({"rows"}))

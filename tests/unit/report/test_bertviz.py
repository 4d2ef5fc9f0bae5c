"""BertViz export: checked by construction against BertViz's documented format."""

import json
from pathlib import Path

import pytest
import torch

from attnprobe.cli import main
from attnprobe.errors import InputError, OutputError
from attnprobe.report.bertviz import bertviz_json, save_bertviz, to_bertviz
from attnprobe.types import AttentionMap, ModelInfo

INFO = ModelInfo(name="tiny", arch="BertModel", n_layers=3, n_heads=4, causal=False)


def make_map(query, key=None, layers=(0, 1), heads=(0, 1, 2), kind="self", seed=0,
             example_id="ex"):
    key = query if key is None else key
    gen = torch.Generator().manual_seed(seed)
    pattern = torch.softmax(torch.randn(len(layers), len(heads), len(query), len(key),
                                        generator=gen), dim=-1)
    return AttentionMap(pattern=pattern, query_tokens=query, key_tokens=key, layers=layers,
                        heads=heads, info=INFO, kind=kind, example_id=example_id)


TOKENS = ("[CLS]", "the", "Ġcat", "▁sat", "[SEP]")


def test_to_bertviz_gives_one_batch1_tensor_per_layer_equal_to_the_pattern():
    amap = make_map(TOKENS)
    attention, tokens = to_bertviz(amap)
    assert isinstance(attention, tuple) and len(attention) == 2
    for i, layer in enumerate(attention):
        assert layer.shape == (1, 3, 5, 5)
        assert torch.equal(layer[0], amap.pattern[i])
    assert tokens == list(TOKENS)  # unchanged, special characters included
    # What bertviz.util.format_attention does: squeeze batch, stack layers.
    assert torch.equal(torch.stack([a.squeeze(0) for a in attention]), amap.pattern)


def test_to_bertviz_does_not_alias_the_map():
    amap = make_map(TOKENS)
    attention, _ = to_bertviz(amap)
    attention[0].zero_()
    assert amap.pattern[0].sum() > 0


@pytest.mark.parametrize("layers, heads, what", [
    ((1, 2), (0, 1, 2), "layers"),
    ((0, 1), (0, 2, 3), "heads"),
    ((1, 0), (0, 1, 2), "layers"),
])
def test_subsets_bertviz_would_mislabel_are_refused_unless_renumber(layers, heads, what):
    amap = make_map(TOKENS, layers=layers, heads=heads)
    with pytest.raises(InputError, match=f"numbers {what} from 0"):
        to_bertviz(amap)
    attention, _ = to_bertviz(amap, renumber=True)
    assert len(attention) == 2 and attention[0].shape[1] == 3


def test_a_prefix_of_layers_and_heads_is_fine():
    attention, _ = to_bertviz(make_map(TOKENS, layers=(0,), heads=(0, 1)))
    assert len(attention) == 1 and attention[0].shape == (1, 2, 5, 5)


def test_cross_attention_is_refused_by_to_bertviz():
    amap = make_map(("a", "b"), ("x", "y", "z"), kind="cross")
    with pytest.raises(InputError, match="bertviz_json"):
        to_bertviz(amap)


def test_bertviz_json_has_heads_view_structure_and_round_trips():
    amap = make_map(TOKENS)
    data = json.loads(json.dumps(bertviz_json(amap)))
    assert set(data) == {"all"}
    assert set(data["all"]) == {"attn", "left_text", "right_text"}
    assert data["all"]["left_text"] == list(TOKENS) == data["all"]["right_text"]
    assert torch.equal(torch.tensor(data["all"]["attn"], dtype=torch.float32), amap.pattern)
    # BertViz's own sanity check: attn[0][0] has one row per token.
    assert len(data["all"]["attn"][0][0]) == len(TOKENS)


def test_cross_attention_json_uses_query_left_and_key_right():
    amap = make_map(("a", "b"), ("x", "y", "z"), kind="cross")
    data = bertviz_json(amap)["all"]
    assert data["left_text"] == ["a", "b"] and data["right_text"] == ["x", "y", "z"]
    attn = torch.tensor(data["attn"])
    assert attn.shape == (2, 3, 2, 3) and torch.allclose(attn, amap.pattern)


def test_save_bertviz_writes_one_entry_per_map_with_model_indices(tmp_path):
    maps = [make_map(TOKENS, example_id="first"),
            make_map(("a", "b"), ("x", "y", "z"), layers=(2,), heads=(1, 3), kind="cross",
                     seed=1, example_id="second")]
    path = save_bertviz(maps, tmp_path / "sub" / "maps.bertviz.json")
    entries = json.loads(path.read_text())
    assert [e["example_id"] for e in entries] == ["first", "second"]
    assert entries[1]["layers"] == [2] and entries[1]["heads"] == [1, 3]
    assert entries[1]["kind"] == "cross"
    for entry, amap in zip(entries, maps, strict=True):
        assert entry["attention"] == json.loads(json.dumps(bertviz_json(amap)))
        assert torch.equal(torch.tensor(entry["attention"]["all"]["attn"]), amap.pattern)


def test_save_bertviz_refuses_nothing_to_export(tmp_path):
    with pytest.raises(InputError, match="no attention maps"):
        save_bertviz([], tmp_path / "x.json")


def test_cli_extract_writes_bertviz_export(tmp_path):
    out, viz = tmp_path / "maps.npz", tmp_path / "maps.bertviz.json"
    assert main(["extract", "--model", "ref:encoder", "--text", "the cat sat", "--text",
                 "a dog", "--out", str(out), "--bertviz", str(viz)]) == 0
    from attnprobe import load_maps

    maps = load_maps(out)
    entries = json.loads(viz.read_text())
    assert len(entries) == len(maps) == 2
    for entry, amap in zip(entries, maps, strict=True):
        assert entry["example_id"] == amap.example_id
        assert entry["attention"]["all"]["left_text"] == list(amap.query_tokens)
        assert torch.allclose(torch.tensor(entry["attention"]["all"]["attn"]), amap.pattern)


def test_cli_extract_without_bertviz_writes_no_export(tmp_path):
    out = tmp_path / "maps.npz"
    assert main(["extract", "--model", "ref:encoder", "--text", "the cat", "--out",
                 str(out)]) == 0
    assert not list(tmp_path.glob("*bertviz*"))


def test_save_bertviz_is_atomic(tmp_path, monkeypatch):
    path = save_bertviz([make_map(TOKENS, example_id="old")], tmp_path / "viz.json")
    before = path.read_text()
    real_write_text = Path.write_text

    def half_then_interrupted(self, text, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", half_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_bertviz([make_map(TOKENS, example_id="new")], path)
    monkeypatch.undo()
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["viz.json"]
    assert json.loads(before)[0]["example_id"] == "old"


def test_save_bertviz_to_a_directory_is_an_output_error(tmp_path):
    with pytest.raises(OutputError, match="is a directory"):
        save_bertviz([make_map(TOKENS)], tmp_path)

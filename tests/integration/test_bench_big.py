"""``analyses/bench_big.py --smoke``: a random LLaMA-layout checkpoint is written shard by
shard with the parameter count of its shape, loaded with a RAM cap below its size (so modules
are offloaded to disk), and every step (plain forward, capture, census, patching, DLA) runs on
it with its checks; the checkpoint builder is deterministic and reuses a complete folder."""

from __future__ import annotations

import importlib
import json

import pandas as pd
import torch
from safetensors.torch import load_file

U_BF16 = 2.0**-8
EPS32 = torch.finfo(torch.float32).eps


def _params(shape: dict, vocab: int) -> int:
    """LLaMA-layout parameters counted by hand: embedding and untied unembedding, per layer
    q/o (h x h), k/v (h x kv·d), gate/up/down (h x i) and two RMSNorm gains, a final norm."""
    h, d = shape["hidden"], shape["hidden"] // shape["heads"]
    kv = shape["kv_heads"] * d
    layer = 2 * h * h + 2 * h * kv + 3 * h * shape["intermediate"] + 2 * h
    return 2 * vocab * h + shape["layers"] * layer + h


def test_bench_big_smoke(tmp_path):
    bench = importlib.import_module("bench_big")
    bench.main(["--smoke", "--out", str(tmp_path)])
    cfg = bench.Config.smoke()
    shape = cfg.shape
    tokenizer = importlib.import_module("harness.big_llama").minilm_tokenizer()
    checks = pd.read_csv(tmp_path / "checks.csv")
    value = dict(zip(checks["step"] + " | " + checks["check"], checks["value"], strict=True))

    assert value["model | parameters"] == _params(shape, len(tokenizer))
    assert value["model | checkpoint MiB"] * 2**20 == 2 * _params(shape, len(tokenizer))  # bf16
    assert value["model | checkpoint MiB"] > value["model | cpu cap MiB"]
    assert value["model | modules on disk"] > 0 and value["model | modules in RAM (cpu)"] > 0

    timing = pd.read_csv(tmp_path / "timing.csv")
    assert list(timing["step"]) == list(bench.STEPS)
    assert (timing["seconds"] > 0).all() and timing["ratio_to_forward"].iloc[0] == 1
    assert (timing["peak_rss_anon_mib"] > 0).all()

    tokens = len(tokenizer(cfg.clean)["input_ids"])
    heads = shape["layers"] * shape["heads"]
    assert value["plain forward | tokens"] == tokens
    assert value["plain forward | finite logits (1 = yes)"] == 1
    assert value["capture (ap.extract) | layers x heads captured"] == heads
    # bf16 maps: each probability rounded once (|error| <= u·p, summing to u over a row) after
    # a float32 softmax normalised over `tokens` keys
    assert value["capture (ap.extract) | max |row sum - 1|"] <= U_BF16 + tokens * EPS32
    assert value["census | heads scored"] == heads
    assert value["census | finite entropies (1 = yes)"] == 1
    assert value["patch.heads | patched heads (table rows)"] == shape["heads"]  # last layer
    assert value["patch.heads | finite effects (1 = yes)"] == 1
    assert value["logit_attribution | head rows"] == heads
    assert value["all | peak reset worked in every step (1 = yes)"] == 1
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/bench_big.py"


def test_random_checkpoint_is_seeded_and_reused(tmp_path):
    big = importlib.import_module("harness.big_llama")
    shape = big.LlamaShape(hidden=16, layers=2, heads=2, kv_heads=1, intermediate=32)
    first = big.write_random_llama(tmp_path / "a", shape, seed=3)
    second = big.write_random_llama(tmp_path / "b", shape, seed=3)
    assert first == second and first["n_params"] == _params(
        {"hidden": 16, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 32},
        first["vocab"])
    shards = sorted(p.name for p in (tmp_path / "a").glob("*.safetensors"))
    assert len(shards) == shape.layers + 2  # embeddings, one per layer, norm + unembedding
    for name in shards:
        a, b = load_file(tmp_path / "a" / name), load_file(tmp_path / "b" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    index = json.loads((tmp_path / "a" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    stamp = (tmp_path / "a" / shards[0]).stat().st_mtime_ns
    assert big.write_random_llama(tmp_path / "a", shape, seed=3) == first
    assert (tmp_path / "a" / shards[0]).stat().st_mtime_ns == stamp  # reused, not rewritten
    other = big.write_random_llama(tmp_path / "a", shape, seed=4)  # another seed: rebuilt
    assert not torch.equal(load_file(tmp_path / "a" / shards[1])["model.layers.0.mlp.up_proj"
                                                                   ".weight"],
                           load_file(tmp_path / "b" / shards[1])["model.layers.0.mlp.up_proj"
                                                                 ".weight"])
    assert other["seed"] == 4

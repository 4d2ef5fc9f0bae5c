"""The loading options of every command (``--dtype``, ``--device``, ``--device-map``,
``--max-memory``, ``--offload-folder``, ``--quantization``) through the real command line, on
a tiny LLaMA saved once per module: an offloaded load gives the very same table as the plain
one, bf16 and int8 loads run, and every bad option is one line on stderr, exit 2, nothing
written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from attnprobe.load_options import DTYPES, QUANTIZATIONS
from tests.helpers import run_cli
from tests.integration.causal_lms import save_lm, text

# layer 0 and the embeddings stay in memory, layer 1 and the LM head go to the offload folder
DEVICE_MAP = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
              "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "disk"}
TEXTS = [text(5, 9, 12, 40, 7), text(11, 23, 8, 61)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    save_lm("llama", folder)
    return folder


@pytest.fixture(scope="module")
def device_map(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("map") / "map.json"
    path.write_text(json.dumps(DEVICE_MAP))
    return path


def _heads(model: Path | str, out: Path, *options: str) -> list[str]:
    argv = ["heads", "--model", str(model), "--out", str(out), "--no-repeated", "--quiet"]
    for line in TEXTS:
        argv += ["--text", line]
    return [*argv, *options]


@pytest.fixture(scope="module")
def plain_table(llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("plain") / "heads.csv"
    from attnprobe.cli import main

    assert main(_heads(llama, out)) == 0
    return out.read_text()


def test_offloaded_heads_table_is_the_plain_one(llama, device_map, plain_table, tmp_path,
                                                capsys):
    out = tmp_path / "heads.csv"
    code, _, err = run_cli(_heads(llama, out, "--device-map", str(device_map),
                                  "--offload-folder", str(tmp_path / "off")), capsys)
    assert code == 0, err
    # same kernels in the same order: the float32 table is identical, not merely close
    assert out.read_text() == plain_table


@pytest.mark.parametrize("options", [["--dtype", "bf16"], ["--quantization", "int8"]])
def test_half_precision_and_int8_loads_run_and_write(llama, tmp_path, capsys, options):
    out = tmp_path / "heads.csv"
    code, _, err = run_cli(_heads(llama, out, *options), capsys)
    assert code == 0, err
    assert out.is_file() and len(out.read_text().splitlines()) > 1


def test_fp16_on_the_cpu_warns_in_one_line(llama, tmp_path, capsys):
    out = tmp_path / "heads.csv"
    code, _, err = run_cli(_heads(llama, out, "--dtype", "fp16", "--device", "cpu"), capsys)
    assert code == 0, err
    warned = [line for line in err.splitlines() if "fp16" in line]
    assert len(warned) == 1 and warned[0].startswith("attnprobe: warning: "), err


def _bad_inputs(tmp_path: Path, llama: Path, device_map: Path) -> dict[str, tuple[list[str],
                                                                                 str]]:
    """name -> (options, what the one-line message must say)."""
    not_json = tmp_path / "map.json"
    not_json.write_text("layers: disk\n")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    on_gpu = tmp_path / "gpu.json"
    on_gpu.write_text(json.dumps({"": "cuda:0"}))  # this machine has no GPU (skipped where it has)
    return {
        "no such device": (["--device", "cuda:3"], "'cuda:3' does not exist"),
        "unknown dtype": (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
        "unknown quantization": (["--quantization", "int3"],
                                 "argument --quantization: invalid choice: 'int3'"),
        "nf4 on the cpu": (["--quantization", "nf4"], "nf4 needs bitsandbytes on a CUDA"),
        "below one layer": (["--max-memory", "cpu=1KB"], "smaller than one layer"),
        "file as offload folder": (["--offload-folder", str(a_file / "off")], "not writable"),
        "malformed max memory": (["--max-memory", "cpu=lots"], "cannot read the memory size"),
        "device and map": (["--device", "cpu", "--device-map", str(device_map)],
                           "not both"),
        "map not json": (["--device-map", str(not_json)], "cannot read the device map"),
        "map on a reference model": (["--model", "ref:transformer", "--device-map", "auto"],
                                     "reference model"),
        "map on a missing gpu": (["--device-map", str(on_gpu)], "'cuda:0' does not exist"),
        "map with a cap": (["--device-map", str(device_map), "--max-memory", "cpu=1GiB"],
                           "ignored"),
    }


BAD = ("no such device", "unknown dtype", "unknown quantization", "nf4 on the cpu",
       "below one layer", "file as offload folder", "malformed max memory", "device and map",
       "map not json", "map on a reference model", "map on a missing gpu", "map with a cap")


@pytest.mark.parametrize("name", BAD)
def test_a_bad_loading_option_is_one_line_and_writes_nothing(llama, device_map, tmp_path,
                                                             capsys, name):
    if name == "map on a missing gpu" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU: cuda:0 exists")
    options, said = _bad_inputs(tmp_path, llama, device_map)[name]
    out = tmp_path / "heads.csv"
    code, stdout, err = run_cli(_heads(llama, out, *options), capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("attnprobe: error: "), err
    assert said in err
    assert not out.exists() and stdout == ""


def test_a_missing_quantization_back_end_names_the_extra(llama, tmp_path, capsys,
                                                         monkeypatch):
    monkeypatch.setitem(sys.modules, "optimum.quanto", None)  # import fails as if absent
    out = tmp_path / "heads.csv"
    code, _, err = run_cli(_heads(llama, out, "--quantization", "int8"), capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "attnprobe[quanto]" in err
    assert not out.exists()


def test_choices_come_from_the_registries(capsys):
    code, help_text, _ = run_cli(["heads", "--help"], capsys)
    assert code == 0
    flat = " ".join(help_text.split())
    for name in QUANTIZATIONS.names():
        assert name in flat
    for name in {"bf16", "fp16", "fp32"} & set(DTYPES):
        assert name in flat


def test_diff_loads_both_models_with_the_same_options(llama, device_map, tmp_path, capsys,
                                                     monkeypatch):
    import attnprobe.loading

    real, placed = attnprobe.loading.load_model, []

    def spy(name, **options):
        model, tokenizer = real(name, **options)
        placed.append(dict(getattr(model, "hf_device_map", {})))
        return model, tokenizer

    monkeypatch.setattr(attnprobe.loading, "load_model", spy)
    out = tmp_path / "diff.csv"
    argv = ["diff", "--model", str(llama), "--model-b", str(llama), "--out", str(out),
            "--no-repeated", "--quiet", "--text", TEXTS[0], "--device-map", str(device_map),
            "--offload-folder", str(tmp_path / "off")]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    assert placed == [DEVICE_MAP, DEVICE_MAP]


def test_diff_in_fp16_on_the_cpu_warns_once(llama, tmp_path, capsys):
    argv = ["diff", "--model", str(llama), "--model-b", str(llama), "--out",
            str(tmp_path / "diff.csv"), "--no-repeated", "--quiet", "--text", TEXTS[0],
            "--dtype", "fp16"]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    assert len([line for line in err.splitlines() if "fp16" in line]) == 1, err

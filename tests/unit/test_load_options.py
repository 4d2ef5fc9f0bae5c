"""Load options (:mod:`attnprobe.load_options`): sizes and memory caps read by construction,
the one-layer threshold of ``max_memory`` computed by hand from the config, the
``from_pretrained`` keywords, every bad option refused by ``ap.load_model`` before any weight
is read, and loads in bf16 / int8 / offloaded."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch
import transformers

import attnprobe as ap
from attnprobe.errors import InputError, MissingExtraError, OutputError
from attnprobe.load_options import LoadOptions, check_fits, parse_max_memory, parse_size
from attnprobe.loading import OFFLOAD_NOTE
from tests.integration.causal_lms import save_lm

DEVICE_MAP = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
              "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "disk"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    save_lm("llama", folder)
    return folder


# ----------------------------------------------------------------------------- sizes
@pytest.mark.parametrize(("text", "size"), [
    ("1.5GiB", int(1.5 * 2**30)), ("20GiB", 20 * 2**30), ("500MB", 500 * 10**6),
    ("1.5GB", int(1.5 * 10**9)), ("64kib", 64 * 2**10), ("1000", 1000), (" 3 MiB ", 3 * 2**20),
    (4096, 4096),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "0", "0GB", "-1GB", "5XB", "GiB", ""])
def test_parse_size_refuses(text):
    with pytest.raises(InputError):
        parse_size(text)


def test_parse_max_memory():
    assert parse_max_memory("0=20GiB,cpu=60GiB") == {0: 20 * 2**30, "cpu": 60 * 2**30}
    assert parse_max_memory("cpu=1.5GB, disk=2TB") == {"cpu": int(1.5 * 10**9),
                                                        "disk": 2 * 10**12}
    assert parse_max_memory({1: "1MiB", "CPU": 10}) == {1: 2**20, "cpu": 10}


@pytest.mark.parametrize("spec", ["", "cpu:20GiB", "gpu=3GB", "cpu=lots", "cpu=20GiB,0"])
def test_parse_max_memory_refuses(spec):
    with pytest.raises(InputError):
        parse_max_memory(spec)


# ----------------------------------------------------------------------------- one layer
def _llama_layer_parameters(config) -> int:
    """A LLaMA decoder layer by hand: q, k, v, o projections (no bias), gate, up, down of the
    MLP and two RMS norms (one weight of the hidden size each)."""
    hidden, inner = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q = o = hidden * config.num_attention_heads * head_dim
    k = v = hidden * config.num_key_value_heads * head_dim
    return q + k + v + o + 3 * hidden * inner + 2 * hidden


@pytest.mark.parametrize(("dtype", "width"), [(None, 4), ("bf16", 2), ("fp32", 4)])
def test_max_memory_below_one_layer_is_refused_exactly_there(llama, dtype, width):
    config = transformers.AutoConfig.from_pretrained(llama)
    layer = _llama_layer_parameters(config) * width
    fits = LoadOptions(dtype=dtype, max_memory={"cpu": layer}).checked()
    check_fits(config, fits)
    short = LoadOptions(dtype=dtype, max_memory={"cpu": layer - 1}).checked()
    with pytest.raises(InputError, match="smaller than one layer"):
        check_fits(config, short)


# ----------------------------------------------------------------------------- keywords
def test_from_pretrained_keywords(tmp_path):
    assert LoadOptions().checked().from_pretrained_keywords() == {}
    assert LoadOptions(dtype="bf16").checked().from_pretrained_keywords() == {
        "dtype": torch.bfloat16}
    assert LoadOptions(device="cpu").checked().from_pretrained_keywords() == {}
    folder = tmp_path / "off"
    found = LoadOptions(device_map=DEVICE_MAP,
                        offload_folder=folder).checked().from_pretrained_keywords()
    assert found == {"device_map": DEVICE_MAP, "offload_folder": str(folder.absolute())}
    assert LoadOptions(device_map="balanced", max_memory="cpu=1GiB").checked(
        ).from_pretrained_keywords() == {"device_map": "balanced", "max_memory": {"cpu": 2**30}}
    assert LoadOptions(max_memory="cpu=1GiB").checked().from_pretrained_keywords()[
        "device_map"] == "auto"  # a cap means an automatic placement
    quantized = LoadOptions(quantization="int8").checked().from_pretrained_keywords()
    config = quantized["quantization_config"]
    assert isinstance(config, transformers.QuantoConfig) and config.weights == "int8"


# ----------------------------------------------------------------------------- refusals
def _bad(tmp_path) -> dict[str, tuple[dict, type, str]]:
    not_json = tmp_path / "map.json"
    not_json.write_text("{layers: disk")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    return {
        "no such device": ({"device": "cuda:3"}, InputError, "does not exist"),
        "not a device": ({"device": "tpu"}, InputError, "device"),
        "unknown dtype": ({"dtype": "fp8"}, InputError, "unknown dtype"),
        "unknown quantization": ({"quantization": "int3"}, InputError,
                                 "unknown quantization"),
        "nf4 on the cpu": ({"quantization": "nf4"}, InputError, "CUDA"),
        "below one layer": ({"max_memory": "cpu=1KB"}, InputError, "smaller than one layer"),
        "file as folder": ({"offload_folder": a_file / "off"}, OutputError, "not writable"),
        "malformed cap": ({"max_memory": "cpu=lots"}, InputError, "memory size"),
        "gpu cap here": ({"max_memory": "0=1GiB"}, InputError, "does not exist"),
        "device and map": ({"device": "cpu", "device_map": DEVICE_MAP}, InputError,
                           "not both"),
        "map not json": ({"device_map": not_json}, InputError, "cannot read the device map"),
        "no such map": ({"device_map": tmp_path / "absent.json"}, InputError, "JSON file"),
        # a map's devices are checked like --device: accelerate would fail deep in the load
        "map on a missing gpu": ({"device_map": {"": "cuda:0"}}, InputError,
                                 "'cuda:0' does not exist"),
        "map on a gpu index": ({"device_map": {"": 0}}, InputError, "does not exist"),
        "map on no device": ({"device_map": {"": "tpu"}}, InputError, "'tpu' is not a device"),
        "map on meta": ({"device_map": {"": "meta"}}, InputError, "without its weights"),
        "map key not a name": ({"device_map": {0: "cpu"}}, InputError, "not a module name"),
        "empty map": ({"device_map": {}}, InputError, "names no module"),
        # accelerate places a dict map as given: the cap would be silently ignored
        "map with a cap": ({"device_map": DEVICE_MAP, "max_memory": "cpu=1GiB"}, InputError,
                           "ignored"),
        # a folder or a cap implies an automatic map: the message names what was given
        "device and folder": ({"device": "cpu", "offload_folder": tmp_path / "off"},
                              InputError, "--offload-folder"),
        "device and cap": ({"device": "cpu", "max_memory": "cpu=1GiB"}, InputError,
                           "--max-memory"),
        # optimum-quanto quantizes while loading and cannot offload (transformers' own rule)
        "quanto offloaded": ({"quantization": "int8", "device_map": DEVICE_MAP,
                              "offload_folder": tmp_path / "off"}, InputError,
                             "cannot offload"),
    }


@pytest.mark.parametrize("name", ["no such device", "not a device", "unknown dtype",
                                  "unknown quantization", "nf4 on the cpu", "below one layer",
                                  "file as folder", "malformed cap", "gpu cap here",
                                  "device and map", "map not json", "no such map",
                                  "map on a missing gpu", "map on a gpu index", "map on no device",
                                  "map on meta", "map key not a name", "empty map",
                                  "map with a cap", "quanto offloaded", "device and folder",
                                  "device and cap"])
def test_load_model_refuses_before_reading_weights(llama, tmp_path, monkeypatch, name):
    def never(*args, **kwargs):
        raise AssertionError("from_pretrained was called")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(never))
    options, error, said = _bad(tmp_path)[name]
    with pytest.raises(error, match=said) as found:
        ap.load_model(str(llama), **options)
    assert "\n" not in str(found.value)


def test_a_missing_back_end_names_the_extra(llama, monkeypatch):
    monkeypatch.setitem(sys.modules, "optimum.quanto", None)  # import fails as if absent
    with pytest.raises(MissingExtraError, match=r"attnprobe\[quanto\]"):
        ap.load_model(str(llama), quantization="int8")


@pytest.mark.parametrize("options", [{"quantization": "nf4"}, {"max_memory": "cpu=1KB"},
                                     {"device": "cuda:3"}])
def test_a_refused_load_leaves_no_offload_folder(llama, tmp_path, options):
    folder = tmp_path / "off"
    with pytest.raises(InputError):
        ap.load_model(str(llama), offload_folder=folder, **options)
    assert not folder.exists()


def test_a_load_refused_after_reading_leaves_no_offload_folder(llama, tmp_path):
    """The folder is created just before the weights are placed: a load that fails there
    (optimum-quanto refuses an automatic map that offloads to disk, known only once accelerate
    has placed the modules) or is refused afterwards (int8 on GPT-2, whose Conv1D layers
    optimum-quanto leaves alone) removes the folders it created, and only those."""
    from tests.big_models import save_family

    gpt2 = save_family("gpt2", tmp_path / "gpt2")
    kept = tmp_path / "kept"
    kept.mkdir()
    # a cap of one int8 layer and a bit more, far below the model: accelerate needs the disk
    layer = _llama_layer_parameters(transformers.AutoConfig.from_pretrained(llama))
    cases = [(str(llama), {"quantization": "int8", "max_memory": {"cpu": layer + 1}}),
             (str(gpt2), {"quantization": "int8"})]
    for model, options in cases:
        with pytest.raises(InputError):
            ap.load_model(model, offload_folder=tmp_path / "new" / "off", **options)
        assert not (tmp_path / "new").exists()
        with pytest.raises(InputError):
            ap.load_model(model, offload_folder=kept / "off", **options)
        assert kept.is_dir() and not (kept / "off").exists()


def test_a_reference_model_refuses_from_pretrained_keywords():
    with pytest.raises(InputError, match="attn_implementation") as found:
        ap.load_model("ref:llama", attn_implementation="eager")
    assert "\n" not in str(found.value)


# ----------------------------------------------------------------------------- loads
def test_bf16_load_gives_bf16_parameters(llama):
    model, _ = ap.load_model(str(llama), dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_int8_load_gives_quanto_linear_layers(llama):
    from optimum.quanto import QLinear

    model, _ = ap.load_model(str(llama), quantization="int8")
    linear = [m for m in model.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linear and all(isinstance(m, QLinear) for m in linear)


def test_a_reference_model_in_bf16():
    model, _ = ap.load_model("ref:llama", dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_an_offloaded_load_is_quiet_about_the_meta_device(llama, tmp_path, caplog):
    logger = logging.getLogger("accelerate.big_modeling")
    filters = list(logger.filters)
    with caplog.at_level(logging.INFO):
        model, _ = ap.load_model(str(llama), device_map=DEVICE_MAP,
                                 offload_folder=tmp_path / "off")
    assert model.hf_device_map == DEVICE_MAP
    assert not [r for r in caplog.records if r.getMessage().startswith(OFFLOAD_NOTE)]
    assert logger.filters == filters  # only during the load: accelerate's other messages
    with caplog.at_level(logging.WARNING):
        logger.warning(OFFLOAD_NOTE + " to the disk.")  # outside a load it shows
    assert caplog.records[-1].getMessage().startswith(OFFLOAD_NOTE)


def test_a_device_map_file_is_read(llama, tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps(DEVICE_MAP))
    model, _ = ap.load_model(str(llama), device_map=path, offload_folder=tmp_path / "off")
    assert model.hf_device_map == DEVICE_MAP


def test_int8_on_a_model_without_linear_layers_is_refused(tmp_path):
    """GPT-2's projections are Conv1D, which optimum-quanto leaves alone: the load would be
    the float32 model under an int8 name, so it is refused in one line."""
    from tests.big_models import save_family

    folder = save_family("gpt2", tmp_path / "gpt2")
    with pytest.raises(ap.InputError, match=r"quantized no layer of GPT2LMHeadModel.*Conv1D"
                       ) as found:
        ap.load_model(str(folder), quantization="int8")
    # the LM head is an nn.Linear that transformers never quantizes: not named as a weight kind
    assert "Linear)" not in str(found.value) and "Linear," not in str(found.value)


def test_a_model_wholly_on_disk_runs_like_the_plain_one(llama, tmp_path):
    """A cap too small for any layer in memory puts the whole model on disk ({'': 'disk'}):
    inputs go to the hooks' execution device, and the maps are the plain model's."""
    plain = ap.load_model(str(llama))
    layer = _llama_layer_parameters(transformers.AutoConfig.from_pretrained(llama)) * 4
    disk = ap.load_model(str(llama), max_memory={"cpu": layer},
                         offload_folder=tmp_path / "off")
    assert disk[0].hf_device_map == {"": "disk"}
    texts = ["the cat sat on the mat"]
    a, b = ap.extract(*plain, texts)[0], ap.extract(*disk, texts)[0]
    assert torch.equal(a.pattern, b.pattern)


def test_the_default_dtype_is_float32_whatever_the_checkpoint_holds(llama, tmp_path):
    """load_model's contract: no dtype means float32 (transformers 5 would otherwise keep a
    bf16 checkpoint in bf16). Upcasting bf16 to float32 is exact, so the values are the
    checkpoint's own; and the one-layer cap is computed at the 32 bits the load will use."""
    half, tokenizer = ap.load_model(str(llama), dtype="bf16")
    half.save_pretrained(tmp_path / "bf16")
    tokenizer.save_pretrained(tmp_path / "bf16")
    model, _ = ap.load_model(str(tmp_path / "bf16"))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    saved = dict(half.named_parameters())
    assert all(torch.equal(p, saved[name].float()) for name, p in model.named_parameters())
    config = transformers.AutoConfig.from_pretrained(tmp_path / "bf16")
    layer = _llama_layer_parameters(config) * 4
    with pytest.raises(InputError, match="at 32 bits"):
        check_fits(config, LoadOptions(max_memory={"cpu": layer - 1}).checked())


@pytest.mark.parametrize(("options", "keyword"), [
    ({"dtype": "bf16", "torch_dtype": torch.float32}, "torch_dtype"),
    ({"quantization": "int8", "quantization_config": None}, "quantization_config")])
def test_an_option_given_twice_is_refused(llama, options, keyword):
    """transformers would silently keep one of the two: refused before anything is read."""
    with pytest.raises(InputError, match=keyword) as found:
        ap.load_model(str(llama), **options)
    assert "\n" not in str(found.value)

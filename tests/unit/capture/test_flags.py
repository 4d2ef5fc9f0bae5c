"""capture()'s keyword flags are a thin shim over parts=: each flag builds one part, a capture
with flags equals the capture with those parts, and the library itself passes parts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import attnprobe
import attnprobe as ap
from attnprobe.capture import Edit, EditOutput, Keep, Live, Reduce, Scores, Values, capture
from attnprobe.capture.flags import FLAG_DEFAULTS, parts_from_flags
from attnprobe.errors import InputError
from attnprobe.heads import Entropy

TEXT = "t01 t02 t03 t01 t02"


def _double_first_key(layer: int, pattern: torch.Tensor) -> torch.Tensor:
    out = pattern.clone()
    out[..., 0] *= 2
    return out / out.sum(-1, keepdim=True)


def kinds(parts):
    return [type(part) for part in parts]


def test_each_flag_names_one_part_in_the_capture_order():
    reducers = [Entropy()]
    assert kinds(parts_from_flags({})) == [Keep]
    assert kinds(parts_from_flags({"keep": False})) == []
    assert kinds(parts_from_flags({"edit": _double_first_key, "edit_output": abs,
                                   "reducers": reducers, "live": True, "values": True,
                                   "scores": True})) == \
        [Edit, EditOutput, Keep, Reduce, Live, Values, Scores]
    (reduce,) = parts_from_flags({"keep": False, "reducers": reducers, "query_block": 4})
    assert reduce.reducers == tuple(reducers) and reduce.query_block == 4
    assert set(FLAG_DEFAULTS) == {"keep", "reducers", "query_block", "edit", "edit_output",
                                  "live", "values", "scores"}


def test_flags_and_parts_give_the_same_capture():
    model, tok = ap.load_model("ref:induction")
    batch = dict(tok([TEXT], return_tensors="pt"))
    with torch.no_grad(), capture(model, "layer:1", edit=_double_first_key,
                                  reducers=[Entropy()]) as by_flags:
        out_flags = model(**batch)
    with torch.no_grad(), capture(model, "layer:1", parts=[Edit(_double_first_key), Keep(),
                                                           Reduce([Entropy()])]) as by_parts:
        out_parts = model(**batch)
    assert torch.equal(out_flags, out_parts)
    assert torch.equal(by_flags.maps[0].pattern, by_parts.maps[0].pattern)
    assert by_flags.edits.equals(by_parts.edits)
    assert by_flags.stats.equals(by_parts.stats)


def test_an_unknown_keyword_and_flags_with_parts_are_refused():
    model, tok = ap.load_model("ref:induction")
    with pytest.raises(TypeError, match="unexpected keyword argument 'kepe'"):
        with capture(model, kepe=False):
            pass
    with pytest.raises(InputError, match=r"not both"):
        with capture(model, parts=[Keep()], live=True):
            pass
    with torch.no_grad(), capture(model, parts=[Keep()], live=False) as cap:  # at its default
        model(**dict(tok([TEXT], return_tensors="pt")))                       # a flag asks nothing
    assert len(cap.maps) == 1


# the callers that still pass flags live in packages being reworked elsewhere
FLAG_CALLERS_LEFT = {"heads/head_census.py", "heads/paired_attention.py", "heads/probe.py",
                     "heads/retrieval.py"}


def test_the_library_passes_parts_not_flags():
    root = Path(attnprobe.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id",
                                                      getattr(node.func, "attr", None)) \
                    == "capture" and {k.arg for k in node.keywords} & set(FLAG_DEFAULTS):
                found.add(path.relative_to(root).as_posix())
    assert found <= FLAG_CALLERS_LEFT, found - FLAG_CALLERS_LEFT

"""Every ``>>>`` example in the docstrings of the public API runs (issue 19 §5).

Which docstrings: those of the modules the API reference renders (the ``::: module`` lines
of ``docs/api/*.md``, so the site and this test walk the same modules): each module's own
docstring and, for every public name (its ``__all__``, else the functions and classes it
defines), the docstrings of that function or class and of the class's methods and properties.
An object re-exported by several modules is run once; a test is named after the module that
defines it (``attnprobe.capture.corpus.extract``).

How they run: as doctests (``>>>`` / ``...`` lines), one test per docstring, its examples in
order in one namespace. Printed output is not compared — write it as a reader would see it,
or leave it out; an example passes when it runs, and **an example that raises fails** (unless
its expected output is a ``Traceback``, doctest's way of showing an error on purpose). Files an
example writes land in a temporary folder that also sees the repository's ``analyses/`` and
``tests/``.

The namespace every example starts from (a fresh copy per docstring; the objects in it are
built once per test run and shared, so an example must not change them in place — take a
``copy.deepcopy(model)`` first):

========================  ==============================================================
``ap``                    ``import attnprobe as ap``
``torch``, ``np``, ``pd`` torch, numpy, pandas
``model``, ``tok``        ``ap.load_model("minilm")``: an encoder (BERT; 6 layers × 12
                          heads); ``tokenizer`` is the same tokenizer as ``tok``
``texts``                 ``["The cat sat on the mat.", "A dog barked at the mailman."]``
``batch``                 ``tok(texts, padding=True, return_tensors="pt")``
``maps``, ``amap``        ``ap.extract(model, tok, texts)`` (``list[AttentionMap]``), and
                          ``maps[0]``
``lm``, ``lm_tok``        ``ap.load_model("ref:induction")``: a causal LM (a 2-layer,
                          4-head copy model whose circuit is known; see the README)
``prompt``                a text for ``lm``: a segment of 8 tokens, then its first 8 again
``trees``                 gold dependency trees of ``texts`` (UD, written by hand: no
                          parser runs), one :class:`~attnprobe.heads.trees.Tree` per text
``lm_census``             ``ap.heads.census(lm, lm_tok, [prompt])``: 8 heads, with head
                          distances and the repeated-token probe
========================  ==============================================================

plus the globals of the module that defines the documented object (as doctest does), so an
example in ``attnprobe/attribution/methods.py`` may call ``attribute(...)`` bare. Inside
these tests ``ap.load_model`` returns the shared ``model, tok`` for ``"minilm"`` and
``lm, lm_tok`` for ``"ref:induction"`` (so an example may load them as a reader would, at no
cost); any other name loads as usual.

Examples known to fail today are listed in :data:`KNOWN_FAILING` with the reason: they are
strict xfails, so fixing one fails its test until its entry is deleted.

Every public function has an example (:func:`test_public_functions_have_examples`); a known
gap is listed, with the reason, in :data:`WITHOUT_EXAMPLE`, and an entry that has its example
by now fails the test until it is deleted. ``python tests/test_docstring_examples.py`` prints
every example found and the public functions without one.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import io
import re
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
API_PAGES = ROOT / "docs" / "api"
PROMPT = "t05 t11 t40 t03 t17 t42 t08 t55 t05 t11 t40 t03 t17 t42 t08 t55"
# gold UD trees of the namespace's texts (ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC)
TREES = "".join(
    f"# sent_id = {n}\n# text = {text}\n" + "".join(
        f"{i}\t{word}\t_\t_\t_\t_\t{head}\t{rel}\t_\t_\n"
        for i, (word, head, rel) in enumerate(words, start=1)) + "\n"
    for n, text, words in [
        (1, "The cat sat on the mat.",
         [("The", 2, "det"), ("cat", 3, "nsubj"), ("sat", 0, "root"), ("on", 6, "case"),
          ("the", 6, "det"), ("mat", 3, "obl"), (".", 3, "punct")]),
        (2, "A dog barked at the mailman.",
         [("A", 2, "det"), ("dog", 3, "nsubj"), ("barked", 0, "root"), ("at", 6, "case"),
          ("the", 6, "det"), ("mailman", 3, "obl"), (".", 3, "punct")]),
    ])

# name of the test (module that defines the object + qualified name) -> why it fails today;
# whoever fixes the example deletes its entry
KNOWN_FAILING: dict[str, str] = {}
# public function (its first documented name, as functions_without_example() lists it) ->
# why it has no example yet (e.g. "being written"); deleted once it has one
WITHOUT_EXAMPLE: dict[str, str] = {}


def documented_modules() -> list[str]:
    """The modules the API reference renders, in page order."""
    names = []
    for page in sorted(API_PAGES.glob("*.md")):
        names += re.findall(r"^:::\s+([\w.]+)", page.read_text(encoding="utf-8"), re.M)
    return list(dict.fromkeys(names))


def public_objects(module: ModuleType) -> list[tuple[str, Any]]:
    """``(public name, object)`` for the functions and classes a module documents."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [name for name, obj in vars(module).items() if not name.startswith("_")
                 and getattr(obj, "__module__", None) == module.__name__]
    found = []
    for name in names:
        obj = getattr(module, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            found.append((f"{module.__name__}.{name}", obj))
    return found


def _defined_name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


@cache
def collect() -> dict[str, tuple[doctest.DocTest, ModuleType]]:
    """Every docstring with examples, by test name, each once, with its defining module."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    own = doctest.DocTestFinder(recurse=False, exclude_empty=True)
    tests: dict[str, tuple[doctest.DocTest, ModuleType]] = {}
    seen: set[tuple[str | None, int | None]] = set()

    def add(test: doctest.DocTest, name: str, home: ModuleType) -> None:
        if test.examples and (test.filename, test.lineno) not in seen:
            seen.add((test.filename, test.lineno))
            tests[name] = (test, home)

    for module_name in documented_modules():
        module = importlib.import_module(module_name)
        for test in own.find(module, module_name, globs={}):
            add(test, module_name, module)
        for public, obj in public_objects(module):
            home = inspect.getmodule(obj)
            for test in finder.find(obj, public, module=home, globs={}):
                # `public` is how a reader reaches it; the test is named where it is defined
                add(test, _defined_name(obj) + test.name[len(public):], home)
    return dict(sorted(tests.items()))


@cache
def functions_without_example() -> list[str]:
    """Public functions (by their first documented name) whose docstring has no ``>>>``."""
    missing, seen = [], set()
    for module_name in documented_modules():
        for public, obj in public_objects(importlib.import_module(module_name)):
            if inspect.isfunction(obj) and id(obj) not in seen:
                seen.add(id(obj))
                if ">>>" not in (inspect.getdoc(obj) or ""):
                    missing.append(public)
    return missing


class _RunsOnly(doctest.OutputChecker):
    """Any printed output is accepted: an example is checked for running, not for its text."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        return True


@pytest.fixture(scope="module")
def namespace() -> dict[str, Any]:
    import numpy as np
    import pandas as pd
    import torch

    import attnprobe as ap

    model, tok = ap.load_model("minilm")
    lm, lm_tok = ap.load_model("ref:induction")
    texts = ["The cat sat on the mat.", "A dog barked at the mailman."]
    maps = ap.extract(model, tok, texts)
    trees = ap.heads.read_conllu(TREES)
    assert [" ".join(t.words) for t in trees] == [t[:-1] + " ." for t in texts]
    return {"ap": ap, "torch": torch, "np": np, "pd": pd, "model": model, "tok": tok,
            "tokenizer": tok, "texts": texts,
            "batch": tok(texts, padding=True, return_tensors="pt"), "maps": maps,
            "amap": maps[0], "lm": lm, "lm_tok": lm_tok, "prompt": PROMPT, "trees": trees,
            "lm_census": ap.heads.census(lm, lm_tok, [PROMPT])}


@pytest.fixture
def shared_models(namespace, monkeypatch):
    """``ap.load_model`` gives the namespace's models for their names (see the docstring)."""
    import attnprobe
    import attnprobe.loading

    real = attnprobe.loading.load_model
    shared = {"minilm": (namespace["model"], namespace["tok"]),
              "ref:induction": (namespace["lm"], namespace["lm_tok"])}

    def load_model(name: str = "minilm", **kwargs: Any) -> Any:
        return shared[name] if name in shared and not kwargs else real(name, **kwargs)

    monkeypatch.setattr(attnprobe, "load_model", load_model)
    monkeypatch.setattr(attnprobe.loading, "load_model", load_model)


def _cases() -> list[Any]:
    cases = []
    for name in collect():
        marks = ()
        if name in KNOWN_FAILING:
            marks = pytest.mark.xfail(reason=KNOWN_FAILING[name], strict=True)
        cases.append(pytest.param(name, id=name, marks=marks))
    return cases


@pytest.mark.parametrize("name", _cases())
def test_docstring_example_runs(name, namespace, shared_models, monkeypatch, tmp_path):
    for folder in ("analyses", "tests"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    monkeypatch.chdir(tmp_path)
    test, home = collect()[name]
    test.globs = {**vars(home), **namespace, "__name__": "__doctest__"}
    report = io.StringIO()
    runner = doctest.DocTestRunner(checker=_RunsOnly(), optionflags=doctest.FAIL_FAST)
    try:
        result = runner.run(test, out=report.write, clear_globs=True)
    finally:
        test.globs = {}
    assert result.failed == 0, f"{name}: an example raised\n{report.getvalue()}"


def test_the_reference_documents_every_public_package():
    found = set(documented_modules())
    assert {"attnprobe", "attnprobe.capture", "attnprobe.heads", "attnprobe.perturb",
            "attnprobe.attribution", "attnprobe.core.scope"} <= found
    assert len(collect()) > 0  # examples are found
    # an entry of KNOWN_FAILING names a docstring with examples (else delete it)
    assert set(KNOWN_FAILING) <= set(collect())


def test_public_functions_have_examples():
    """Every public function's docstring has a ``>>>`` example, except the known gaps."""
    missing = set(functions_without_example())
    unlisted = sorted(missing - set(WITHOUT_EXAMPLE))
    assert not unlisted, ("public functions without a docstring example (add one: "
                          f"tests/test_docstring_examples.py lists the names): {unlisted}")
    done = sorted(set(WITHOUT_EXAMPLE) - missing)
    assert not done, f"these have an example now; delete them from WITHOUT_EXAMPLE: {done}"


if __name__ == "__main__":  # the examples found, and the functions without one
    for name, (test, _) in collect().items():
        where = Path(test.filename or "?").resolve()
        where = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
        print(f"{name}  ({where}:{(test.lineno or 0) + 1}, {len(test.examples)} lines)")
    missing = functions_without_example()
    print(f"\n{len(collect())} docstrings with examples; {len(missing)} public functions "
          "without an example:", *missing, sep="\n  ")

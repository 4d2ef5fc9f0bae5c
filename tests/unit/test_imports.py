from tests.helpers import fresh_python

HEAVY = ("transformers", "captum", "matplotlib", "spacy", "seaborn")


def test_import_attnprobe_stays_light():
    code = ("import sys, attnprobe, attnprobe.models, attnprobe.heads, attnprobe.capture; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    assert fresh_python(code) == "[]"


def test_missing_extra_names_the_extra():
    from attnprobe.core.optional import require
    from attnprobe.errors import MissingExtraError

    try:
        require("captum_does_not_exist")
    except MissingExtraError as exc:
        assert "pip install 'attnprobe[" in str(exc)
    else:
        raise AssertionError("require() should have raised")

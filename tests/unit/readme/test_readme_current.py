"""The README's generated parts agree with the registries they are written from."""

from pathlib import Path

from attnprobe.readme import markers, parts, stale_parts

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_is_current():
    stale = stale_parts(README.read_text(encoding="utf-8"))
    assert stale == [], (f"README parts {', '.join(stale)} differ from the registries: run "
                         "`make readme`")


def test_every_part_has_its_markers_once_in_the_readme():
    text = README.read_text(encoding="utf-8")
    for part in parts():
        start, end = markers(part.name)
        assert text.count(start) == 1 and text.count(end) == 1, part.name
        assert text.index(start) < text.index(end), part.name


def test_a_hand_edit_inside_a_generated_span_is_found_stale():
    text = README.read_text(encoding="utf-8")
    start = markers("scores")[0]
    inside = text.index(start) + len(start)
    edited = f"{text[:inside]}\n| `made_up` | a row no score declares |{text[inside:]}"
    assert stale_parts(edited) == ["scores"] and stale_parts(text) == []

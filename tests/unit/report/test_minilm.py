import re

import pytest


def test_real_minilm_page_of_about_122_tokens_with_every_head_is_under_2mb():
    """The reference page: one ~122-token sentence, all 72 heads with their thumbnails (drawn
    from the page's data) and census panels, the head grid and profile (BertViz: 48.5 MB)."""
    pytest.importorskip("transformers")
    import attnprobe as ap
    from attnprobe.heads import census
    from attnprobe.report import build

    try:
        model, tokenizer = ap.load_model("minilm")
    except Exception as err:  # model package not installed here
        pytest.skip(f"minilm unavailable: {err}")
    sentence = "The quick brown fox jumps over the lazy dog near the river."
    text = " ".join([sentence] * 9 + ["It ran away."])  # 123 tokens with [CLS]/[SEP]
    maps = ap.extract(model, tokenizer, [text])
    amap = maps[0] if isinstance(maps, list) else maps
    assert amap.pattern.shape[:2] == (6, 12) and 100 <= amap.pattern.shape[2] <= 140
    report = build(maps=[amap], census=census(model, tokenizer, [text], progress=False))
    assert report.size_bytes <= 2_000_000
    assert "MiniLM" in report.html or amap.info.name in report.html
    panels = re.findall(r'class="ap-detail" [^>]*data-layer="(\d+)" data-head="(\d+)"',
                        report.html)
    assert sorted((int(la), int(h)) for la, h in panels) == \
        [(la, h) for la in range(6) for h in range(12)]
    assert "Labels from 1 sentence(s)." in report.html

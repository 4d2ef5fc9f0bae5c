import pytest


def test_real_minilm_map_of_about_122_tokens_is_under_2mb():
    pytest.importorskip("transformers")
    import attnprobe as ap
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
    report = build(maps=[amap])
    assert report.size_bytes <= 2_000_000
    assert "MiniLM" in report.html or amap.info.name in report.html

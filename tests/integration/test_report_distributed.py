"""``attnprobe report --distributed`` on two torch.distributed (gloo) processes writes the page
of one process: every rank runs every step of the report's pipeline (the census, and the
comparison, maps and perturbation of the view texts, each split over the ranks), so no rank
waits on one that has already left."""

from __future__ import annotations

from tests.integration.distributed import run_cli_ranks

TEXTS = ["The cat chased a small mouse.", "A dog barked at the old man.",
         "We saw the house.", "The bird sang."]


def test_two_processes_write_the_page_of_one(tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    argv = ["report", "--model", "minilm", "--text-file", str(texts), "--target",
            "similarity:A pet.", "--n-steps", "3", "--perturb", "uniform", "--scope",
            "layer:0", "--view-texts", "2", "--batch-size", "2", "--quiet", "--distributed"]
    pages = []
    for world in (1, 2):
        out = tmp_path / f"world{world}.html"
        run_cli_ranks([*argv, "--out", str(out)], world=world)
        pages.append(out.read_text(encoding="utf-8"))
    assert 'id="sec-comparison"' in pages[0] and 'id="sec-perturbation"' in pages[0]
    assert pages[1] == pages[0]


def test_two_processes_write_the_causal_sections_of_one(tmp_path):
    """Direct logit attribution and patching split over the ranks give the page of one."""
    clean = ["t01 t02 t03 t04 t01 t02 t03", "t05 t06 t07 t05 t06 t07 t05", "t08 t09 t08 t09"]
    corrupt = ["t11 t12 t13 t14 t01 t02 t03", "t15 t16 t17 t18 t06 t07 t05", "t18 t19 t08 t09"]
    files = []
    for name, lines in (("clean.txt", clean), ("corrupt.txt", corrupt)):
        files.append(tmp_path / name)
        files[-1].write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["report", "--model", "ref:induction", "--text-file", str(files[0]),
            "--corrupt-file", str(files[1]), "--metric-positions", "all", "--view-texts", "1",
            "--batch-size", "2", "--quiet", "--distributed"]
    pages = []
    for world in (1, 2):
        out = tmp_path / f"world{world}.html"
        run_cli_ranks([*argv, "--out", str(out)], world=world)
        pages.append(out.read_text(encoding="utf-8"))
    for section in ("sec-logit-attribution", "sec-composition", "sec-patching"):
        assert f'id="{section}"' in pages[0], section
    assert pages[1] == pages[0]

# Two entry points for a fresh machine:  make demo  and  make test
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.attnprobe-installed

.PHONY: setup demo test lint bench docs readme
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[all]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/attnprobe extract --model minilm --text-file analyses/data/demo_sentences.txt \
		--out runs/demo/maps.npz --show 80
	$(VENV)/bin/attnprobe heads --model minilm --text-file analyses/data/census_sentences.txt \
		--out runs/demo/heads.csv --profile runs/demo/layers.csv --quiet
	$(VENV)/bin/attnprobe report --model minilm --text-file analyses/data/census_sentences.txt \
		--syntax --out runs/demo/report.html --quiet

# Every core (pytest-xdist, -n auto): a file's tests run on one worker (--dist loadfile), so
# its module fixtures are built once; each worker's torch gets its share of the cores
# (tests/conftest.py). PYTEST_ARGS adds options, e.g. make test PYTEST_ARGS="-x tests/unit".
TEST_WORKERS ?= auto
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check attnprobe analyses reports tests docs

# The API reference and guide (mkdocs.yml) into site/; warnings are errors. Open site/index.html.
docs: setup
	$(VENV)/bin/mkdocs build --strict --site-dir site

# README tables generated from the code (the score table from the score declarations).
readme: setup
	$(PY) -m attnprobe.readme

bench: setup
	$(PY) analyses/bench_capture.py
	$(PY) analyses/bench_census.py
	$(PY) analyses/bench_attribution.py
	$(PY) analyses/bench_perturb.py
	$(PY) analyses/bench_flow.py

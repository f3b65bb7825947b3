# Two commands matter: `make run` (install what is missing, build the models, serve) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test install models lint typecheck unit pytest openapi bench clean

run: models
	$(PY) -m gateway dev

test: install lint typecheck unit pytest

install: $(STAMP)

# torch==2.13.0 is pinned in pyproject.toml: a CPU build of it lies on these machines' disk, while
# any other release would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] in ((3, 10), (3, 11), (3, 12)), "Python 3.10, 3.11 or 3.12 is needed"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

models: install
	$(PY) -m build_models

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy --strict gateway build_models load devtools tests deploy/helm/textscore/files/drain.py

# The fast layer (fake Triton client, static checks; seconds): the feedback loop while editing.
unit: install
	$(PY) -m pytest -ra -m "not triton"

# The tests that build small models and run a real tritonserver (minutes).
pytest: install
	$(PY) -m pytest -ra -m triton

openapi: install
	$(PY) -m gateway openapi > docs/openapi.json

clean:
	rm -rf .work model_repository/pipelines
	find model_repository -path "*/[0-9]*/*" ! -path model_repository/preprocess/1/model.py ! -name .gitkeep -delete
	find model_repository -mindepth 2 -maxdepth 2 -type d -empty -delete

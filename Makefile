# fedlightning developer commands. `make help` lists them.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help install demo test test-all notebooks notebooks-open bench bench-peers bench-gpu gpu-wheels lint clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-9s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev,ray,data,hf,flower,privacy,tensorboard,notebooks]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install fedlightning (editable) with dev tools, Ray, HF datasets, Flower, Opacus, TensorBoard and JupyterLab; idempotent

demo: install  ## federated training on the bundled digits data (offline, about 17 CPU-s)
	$(VENV)/bin/fedlightning fit --config configs/quickstart.yaml

# the tests across the machine's cores (at most 4 processes), each file's tests in one process
# (a module's fixtures are built once); `PYTEST_WORKERS=0 make test` runs them in this process
PYTEST_WORKERS ?= auto
XDIST := -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile

test: install  ## the test suite without the tests marked slow (CPU, tiny data, about 8 min on 2 cores)
	$(PY) -m pytest $(XDIST)

test-all: install  ## every test, including those marked slow (Ray, SIGKILL resume, notebooks)
	$(PY) -m pytest $(XDIST) -m "slow or not slow"

notebooks: install  ## run every notebook at full size; each copy with its outputs goes to notebooks/runs/<name>.ipynb (notebook 01: 30 CPU-s)
	mkdir -p notebooks/runs
	$(VENV)/bin/jupyter execute --output='runs/{notebook_name}' notebooks/*.ipynb

notebooks-open: install  ## open notebooks/ in JupyterLab (make install's front end) in the browser; Ctrl-C stops it
	$(PY) -m jupyterlab notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

bench: install  ## loop overhead against a hand-written PyTorch loop, and scaling tables
	$(PY) benchmarks/overhead.py --threads 1 --repeats 3
	$(PY) benchmarks/scaling.py

PEERS := .venv-peers
bench-peers: install  ## Flower 1.42 in its own .venv-peers (sees .venv's torch), then benchmarks/cohort.py
	$(PYTHON) -m venv $(PEERS)
	$(PY) -c "import site; print(site.getsitepackages()[0])" > "$$($(PEERS)/bin/python -c 'import site; print(site.getsitepackages()[0])')/_fedlightning.pth"
	$(PEERS)/bin/pip install --quiet --no-deps flwr==1.42.0
	$(PEERS)/bin/pip install --quiet alembic cryptography fastapi grpcio grpcio-health-checking iterators \
		pathspec pycryptodome sqlalchemy starlette tomli tomli-w typer uvicorn 'protobuf>=5.28,<7' \
		'rich>=14,<15' 'packaging<26'
	$(PY) benchmarks/cohort.py --quick

bench-gpu: install  ## the whole GPU set (determinism, resume, FedCross CNN, scaling, auto, precisions) in under 8 minutes; tables in runs/gpu_all.txt
	$(PY) benchmarks/gpu_all.py --out runs/gpu_all.txt

WHEELS := jsonargparse==4.53.0 docstring_parser==0.18.0 typeshed_client==2.15.0
gpu-wheels:  ## the CLI's parser as wheels in .whl (ignored by git), for a GPU machine that lacks them (benchmarks/gpu_all.py)
	exclude=$$(git rev-parse --git-path info/exclude); grep -qx '/.whl/' $$exclude || echo '/.whl/' >> $$exclude
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux2014_x86_64 -d .whl $(WHEELS)

lint: install  ## ruff lint and format check
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

clean:  ## remove the virtual environment and run outputs
	rm -rf $(VENV) runs

"""Every notebook under notebooks/ runs top to bottom at tiny size, quietly, writing its runs where
the README says; ``make install`` installs the front end that opens them (JupyterLab) and ``make
notebooks-open`` serves them with a kernel.

Like papermill, the test inserts a cell after the one tagged ``parameters`` that overrides its
values, then executes the notebook with nbclient in a scratch folder (as Jupyter and ``make
notebooks`` do in notebooks/). A fit shows one display that it updates in place (issue 34 item 4:
a line per round made 34 outputs in notebook 01's fit cell, 856 in notebook 02's).
"""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from packaging.requirements import Requirement

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TINY = {
    "01_quickstart": {"ROUNDS": 2, "NUM_CLIENTS": 6, "CLIENTS_PER_ROUND": 3},
    "02_fedcross_ablation": {
        "ROUNDS": 2,
        "SELECTIONS": ["lowest_similarity", "in_order"],
        "ALPHAS": [0.5, 0.99],
    },
    "03_heterogeneous_inco": {"ROUNDS": 2, "SEEDS": [0], "WIDTH": 4},
    "04_fml_personalization": {"ROUNDS": 2},
    "05_cofed": {"NUM_PARTICIPANTS": 4, "EPOCHS": 2, "UPDATE_EPOCHS": 1},
}


def test_every_notebook_has_tiny_parameters():
    assert NOTEBOOKS and {nb.stem for nb in NOTEBOOKS} <= set(TINY)


@pytest.mark.slow  # a kernel per notebook, 10-20 s each; `make test-all` runs them
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    book = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in book.cells if cell.cell_type == "code"), (
        "commit without outputs"
    )
    position = next(
        i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", [])
    )
    overrides = "\n".join(f"{name} = {value!r}" for name, value in TINY[path.stem].items())
    book.cells.insert(position + 1, nbformat.v4.new_code_cell(overrides))
    NotebookClient(
        book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    texts = [
        output.get("text") or output.get("data", {}).get("text/plain", "")
        for cell in book.cells if cell.cell_type == "code" for output in cell.outputs
    ]  # fmt: skip
    lines = "\n".join(texts).splitlines()
    fits = sum(line.startswith("done: round") for line in lines)
    progress = [line for line in lines if re.match(r"round \d+/\d+", line)]
    assert len(progress) == fits, progress  # each fit's display: its last round, once
    if path.stem != "05_cofed":  # CoFED is one shot, no rounds
        assert fits >= 1
        assert {p.name for p in tmp_path.iterdir() if p.is_dir()} == {"runs"}  # the README's place


def _front_end_pin() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (pin,) = project["optional-dependencies"]["notebooks"]
    return pin


def test_make_install_installs_jupyterlab_and_the_readme_names_it():
    """The front end that opens the notebooks (issue 38 item 4): JupyterLab, in ``make
    install``'s extras at a tested range, installed in this environment within that range;
    the README's notebook step names it and ``make notebooks-open`` runs it (the slow test below
    serves the notebooks with it)."""
    pin = Requirement(_front_end_pin())
    assert pin.name == "jupyterlab" and str(pin.specifier)  # a range, not any version
    install = re.search(r"pip install --quiet -e '\.\[([\w,]+)\]'", (ROOT / "Makefile").read_text())
    assert install and "notebooks" in install[1].split(",")
    try:
        installed = version("jupyterlab")
    except PackageNotFoundError:
        pytest.fail("JupyterLab is not installed: make install installs it (the notebooks extra)")
    assert pin.specifier.contains(installed), f"jupyterlab {installed} is not {pin}"
    assert "make notebooks-open" in README and "JupyterLab" in README
    assert re.search(r"-m jupyterlab notebooks\b", _open_command())


def _open_command() -> str:
    """What ``make notebooks-open`` runs (its last line; ``make -n`` runs nothing; under a parent
    make, as in CI's ``make test``, make would add "Leaving directory" lines without
    ``--no-print-directory``)."""
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "notebooks-open"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # starts a JupyterLab server (about 10 s)
def test_make_notebooks_open_serves_the_notebooks_with_a_kernel(tmp_path):
    """``make notebooks-open``'s command, on 127.0.0.1 without a browser: JupyterLab's page, the
    notebooks folder with every notebook, a notebook read as one, and the Python kernel."""
    words = shlex.split(_open_command())
    assert words[1:4] == ["-m", "jupyterlab", "notebooks"]
    port, token = _free_port(), "fedlightning-test"
    command = [sys.executable, *words[1:], "--no-browser", "--ip", "127.0.0.1",
               f"--port={port}", f"--IdentityProvider.token={token}"]  # fmt: skip
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    with open(tmp_path / "lab.log", "w") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
    try:

        def get(path: str) -> tuple[int, bytes]:
            url = f"http://127.0.0.1:{port}{path}?token={token}"
            with urllib.request.urlopen(url, timeout=10) as answer:
                return answer.status, answer.read()

        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "lab.log").read_text()[-3000:]
            try:
                if get("/api/status")[0] == 200:
                    break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "lab.log").read_text()[-3000:]
                time.sleep(0.5)
        status, page = get("/lab")
        assert status == 200 and b"<title>JupyterLab</title>" in page
        listing = json.loads(get("/api/contents")[1])
        assert {item["name"] for item in listing["content"]} >= {p.name for p in NOTEBOOKS}
        book = json.loads(get(f"/api/contents/{NOTEBOOKS[0].name}")[1])
        assert book["type"] == "notebook" and book["content"]["cells"]
        assert "python3" in json.loads(get("/api/kernelspecs")[1])["kernelspecs"]
    finally:
        server.terminate()
        server.wait(timeout=60)

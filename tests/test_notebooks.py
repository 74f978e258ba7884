"""Every notebook under notebooks/ runs top to bottom at tiny size, quietly, writing its runs where
the README says.

Like papermill, the test inserts a cell after the one tagged ``parameters`` that overrides its
values, then executes the notebook with nbclient in a scratch folder (as Jupyter and ``make
notebooks`` do in notebooks/). A fit shows one display that it updates in place (issue 34 item 4:
a line per round made 34 outputs in notebook 01's fit cell, 856 in notebook 02's).
"""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))
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

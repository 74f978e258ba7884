"""The README's Hugging Face lines, as written, without the internet: its ``save_to_disk`` lines run
with ``datasets.load_dataset`` answering from tiny data sets of the named sets' columns and splits
(``uoft-cs/cifar10``: RGB ``img`` and ``label``, train and test; ``flwrlabs/femnist``: grey
``image``, ``character`` and ``writer_id``, a train split only), then every README command that
reads their folders runs through ``fedlightning fit`` on them (``--fast_dev_run``: one short
round, nothing written) as a process of its own, printing no third-party warning."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stderr_noise import third_party_warnings

datasets = pytest.importorskip("datasets")
Image = pytest.importorskip("PIL.Image")

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()


def _images(n: int, size: int, mode: str, seed: int) -> list:
    rng = np.random.default_rng(seed)
    shape = (size, size, 3) if mode == "RGB" else (size, size)
    return [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode) for _ in range(n)]


def _cifar10(n: int, seed: int) -> "datasets.Dataset":
    features = datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")})
    data = {"img": _images(n, 32, "RGB", seed), "label": [i % 10 for i in range(n)]}
    return datasets.Dataset.from_dict(data, features=features)


def _femnist(writers: int, per_writer: int) -> "datasets.Dataset":
    n = writers * per_writer
    features = datasets.Features(
        {"image": datasets.Image(), "character": datasets.Value("int64"),
         "writer_id": datasets.Value("string")}
    )  # fmt: skip
    data = {
        "image": _images(n, 28, "L", 2),
        "character": [i % 10 for i in range(n)],
        "writer_id": [f"f{i % writers:04d}" for i in range(n)],
    }
    return datasets.Dataset.from_dict(data, features=features)


def fake_load_dataset(name: str, *args, **kwargs) -> "datasets.DatasetDict":
    """What the Hub would answer for the README's two names, tiny."""
    if name == "uoft-cs/cifar10":
        return datasets.DatasetDict({"train": _cifar10(400, 0), "test": _cifar10(100, 1)})
    if name == "flwrlabs/femnist":
        return datasets.DatasetDict({"train": _femnist(writers=100, per_writer=6)})
    raise AssertionError(f"the README loads an unexpected data set: {name}")


def _readme_lines(prefix: str) -> list[list[str]]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith(prefix):
                lines.append(shlex.split(line))
    return lines


@pytest.mark.slow  # three runs through the CLI on image data sets (about a minute on 2 cores)
def test_the_save_to_disk_lines_make_the_folders_the_hf_commands_read(tmp_path, monkeypatch):
    saves = _readme_lines('python -c "from datasets import load_dataset;')
    fits = _readme_lines("fedlightning fit -c configs/quickstart.yaml --data.dataset huggingface")
    assert len(saves) == 2 and len(fits) == 3
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    for words in saves:
        assert words[:2] == ["python", "-c"]
        exec(words[2], {})  # as `python -c` runs it
    for folder in ("data/cifar10_hf", "data/femnist_hf"):
        assert (tmp_path / folder / "dataset_dict.json").is_file(), folder
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    for words in fits:  # as the user runs them: no third-party warning on stderr either
        done = subprocess.run(
            [sys.executable, "-m", "fedlightning.cli", *words[1:], "--fast_dev_run"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert done.returncode == 0 and "fast_dev_run passed" in done.stdout, done.stderr[-3000:]
        assert third_party_warnings(done.stderr) == [], done.stderr
    assert not (tmp_path / "runs").exists()  # nothing written but the data

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from fedlightning.cli import main

CONF = Path(__file__).parent / "conf"


def run_cli(run_dir: Path, *args: str, config: str = "tiny.yaml") -> list[dict[str, str]]:
    """Run ``fedlightning fit`` in-process on a test config; return the rows of metrics.csv."""
    sys.argv = ["fedlightning"]  # LightningCLI warns when both sys.argv and args are given
    main(["fit", "--config", str(CONF / config), "--loop.run_dir", str(run_dir), *args])
    with open(run_dir / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture
def cli():
    return run_cli

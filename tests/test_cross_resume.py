"""Cross-resume matrix: a checkpoint of every shipped config (configs/*.yaml; CoFED's are one-shot
and have no checkpoints) resumed under every other config is either refused with a one-line
message naming the field that differs, both values and what to do, writing nothing, or (were two
configs the same run) resumed bitwise equal to a straight run. A config resumed under itself is
tests/test_resume_all.py."""

import re
import sys
from pathlib import Path

import pytest
import torch

from fedlightning.cli import main

pytestmark = pytest.mark.slow  # 110 pairs, each building its config's model and data: minutes

CONFIGS = sorted(
    p
    for p in (Path(__file__).parents[1] / "configs").glob("*.yaml")
    if not p.name.startswith("cofed")
)
PAIRS = [(a, b) for a in CONFIGS for b in CONFIGS if a != b]
SMALL = ["--loop.local_steps", "1", "--loop.eval_every", "4", "--loop.progress_bar", "false",
         "--loop.plots", "false"]  # fmt: skip
REFUSED = re.compile(
    r"^fedlightning: error: ckpt_path='[^']+' was written by another run: (\S+) is (.+) in the "
    r"checkpoint but (.+) in this run; resume with the same .+, or start a new run in another "
    r"--loop.run_dir\n\Z"
)


def _fit(config: Path, run_dir: Path, rounds: int, *extra: str) -> None:
    sys.argv = ["fedlightning"]
    main(["fit", "--config", str(config), "--loop.run_dir", str(run_dir), "--loop.rounds",
          str(rounds), *SMALL, *extra])  # fmt: skip


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("cross")
    made: dict[str, Path] = {}

    def get(config: Path) -> Path:
        if config.stem not in made:
            _fit(config, root / config.stem, 1)
            made[config.stem] = root / config.stem / "last.ckpt"
        return made[config.stem]

    return get


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=[f"{a.stem}->{b.stem}" for a, b in PAIRS])
def test_a_checkpoint_resumed_under_another_config_is_refused_or_bitwise(
    checkpoints, tmp_path, capsys, first, second
):
    checkpoint = checkpoints(first)
    before = checkpoint.read_bytes()
    capsys.readouterr()
    try:
        _fit(second, tmp_path / "resumed", 2, "--ckpt_path", str(checkpoint))
    except SystemExit as exit_info:
        assert exit_info.code == 2
        err = capsys.readouterr().err
        match = REFUSED.match(err)
        assert match and match[2] != match[3], err[-2000:]
        assert not (tmp_path / "resumed").exists()
    else:  # the two configs describe the same run: the resume must be exact
        _fit(second, tmp_path / "straight", 2)
        assert (tmp_path / "resumed" / "global.pt").read_bytes() == (
            tmp_path / "straight" / "global.pt"
        ).read_bytes()
    assert checkpoint.read_bytes() == before
    assert torch.load(checkpoint, weights_only=True)["round"] == 1

"""Cross-resume matrix: a checkpoint of every shipped config (configs/*.yaml; CoFED's are one-shot
and have no checkpoints) resumed under every other config is either refused with a one-line
message naming the field that differs, both values and what to do, writing nothing, or (were two
configs the same run) resumed bitwise equal to a straight run. A config resumed under itself is
tests/test_resume_all.py.

Every ordered pair goes through the comparison a resume makes (:func:`compare_identity` on the
two checkpoints' identities: the identity a config's resume computes is its own checkpoint's, but
for the options a resume may change, such as ``loop.rounds``), which costs no training; a ring of
pairs (each config's checkpoint resumed under the next config) goes through the CLI end to end and
must print exactly the line that comparison predicts. The quadratic part thus stays seconds as
configs are added (it trained and built every pair's model and data: 342 pairs, most of CI's
slow stage), while the CLI's wiring is checked on every config as the resumed and the resuming
one.
"""

import fcntl
import re
import shutil
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
import torch

from fedlightning.cli import main
from fedlightning.errors import ConfigurationError
from fedlightning.loop.identity import compare_identity

pytestmark = pytest.mark.slow  # one 1-round fit and one refused resume per config: minutes

CONFIGS = sorted(
    p
    for p in (Path(__file__).parents[1] / "configs").glob("*.yaml")
    if not p.name.startswith("cofed")
)
RING = [(a, CONFIGS[(i + 1) % len(CONFIGS)]) for i, a in enumerate(CONFIGS)]
SMALL = ["--loop.local_steps", "1", "--loop.eval_every", "4", "--loop.progress_bar", "false",
         "--loop.plots", "false"]  # fmt: skip
REFUSED = re.compile(
    r"^ckpt_path='[^']+' was written by another run: (\S+) is (.+) in the checkpoint but (.+) in "
    r"this run; resume with the same .+, or start a new run in another --loop.run_dir\Z"
)


def _fit(config: Path, run_dir: Path, rounds: int, *extra: str) -> None:
    sys.argv = ["fedlightning"]
    main(["fit", "--config", str(config), "--loop.run_dir", str(run_dir), "--loop.rounds",
          str(rounds), *SMALL, *extra])  # fmt: skip


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, worker_id) -> Callable[[Path], Path]:
    """``fitted(config)``: the config's checkpoint after one round, fitted once in the whole
    session. CI's slow stage hands this module's tests to several xdist processes one by one, so
    the runs live in a folder all of them share, each fitted under a lock by the first process
    that needs it (xdist's recipe for work done once per session)."""
    base = tmp_path_factory.getbasetemp()
    root = (base if worker_id == "master" else base.parent) / "cross-resume"
    root.mkdir(exist_ok=True)

    def get(config: Path) -> Path:
        run_dir = root / config.stem
        with open(root / f"{config.stem}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not (run_dir / "fitted").exists():
                shutil.rmtree(run_dir, ignore_errors=True)  # a fit that failed half-way
                _fit(config, run_dir, 1)
                (run_dir / "fitted").touch()
        return run_dir / "last.ckpt"

    return get


@cache
def _identity(checkpoint: Path) -> dict:
    return torch.load(checkpoint, weights_only=True)["identity"]


def _predicted(checkpoint: Path, resumer: Path) -> str | None:
    """The line a resume of ``checkpoint`` under the config whose checkpoint is ``resumer``
    prints (``None``: it resumes), from the two checkpoints' identities."""
    try:
        compare_identity(str(checkpoint), _identity(checkpoint), _identity(resumer))
    except ConfigurationError as refusal:
        return str(refusal)
    return None


def test_no_two_shipped_configs_resume_each_other_unless_they_are_the_same_run(fitted, tmp_path):
    checkpoints = {config.stem: fitted(config) for config in CONFIGS}
    same_run = []
    for first in CONFIGS:
        for second in CONFIGS:
            if first == second:
                continue
            line = _predicted(checkpoints[first.stem], checkpoints[second.stem])
            if line is None:
                same_run.append((first, second))
                continue
            match = REFUSED.match(line)
            assert match and match[2] != match[3], f"{first.stem}->{second.stem}: {line}"
    for first, second in same_run:  # the two configs describe the same run: exact
        resumed, straight = tmp_path / f"{first.stem}-{second.stem}", tmp_path / "straight"
        _fit(second, resumed, 2, "--ckpt_path", str(checkpoints[first.stem]))
        _fit(second, straight, 2, "--loop.overwrite", "true")
        assert (resumed / "global.pt").read_bytes() == (straight / "global.pt").read_bytes()


@pytest.mark.parametrize(("first", "second"), RING, ids=[f"{a.stem}->{b.stem}" for a, b in RING])
def test_a_checkpoint_resumed_under_another_config_prints_the_predicted_line(
    fitted, tmp_path, capsys, first, second
):
    checkpoint = fitted(first)
    before = checkpoint.read_bytes()
    predicted = _predicted(checkpoint, fitted(second))
    capsys.readouterr()
    if predicted is None:
        pytest.skip(f"{first.stem} and {second.stem} are the same run (checked bitwise above)")
    with pytest.raises(SystemExit) as exit_info:
        _fit(second, tmp_path / "resumed", 2, "--ckpt_path", str(checkpoint))
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"fedlightning: error: {predicted}\n"
    assert not (tmp_path / "resumed").exists()
    assert checkpoint.read_bytes() == before
    assert torch.load(checkpoint, weights_only=True)["round"] == 1

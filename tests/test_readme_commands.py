"""Every `fedlightning` command in the README parses and resolves as written (`--print_config`
for `fit`/`cofed`: option names, values and configs are checked, the data set's sizes read where
the data is on disk), and the "Adding an algorithm" example is `examples/plugins.py` and runs
through the CLI exactly as the README shows it."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fedlightning.cli import main

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
LOOP_VALUES = {"$seed": "0", "${agg}": "FedAvg", "$agg": "FedAvg"}


def readme_commands() -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split("  #")[0].strip()
            if "fedlightning " not in line or line.startswith("#"):
                continue
            for variable, value in LOOP_VALUES.items():
                line = line.replace(variable, value)
            commands.append(line)
    return commands


COMMANDS = readme_commands()


def test_readme_has_the_front_door_commands():
    joined = "\n".join(COMMANDS)
    for expected in (
        "fedlightning --help", "fedlightning --version", "--group-by", "huggingface",
        "fedlightning list", "--fast_dev_run", "--seeds 0 1 2", "--loop.aggregator FedAvgM",
    ):  # fmt: skip
        assert expected in joined


def _run_dir_written(words: list[str]) -> str | None:
    """The run directory a README command writes (``--loop.run_dir``/``--run_dir``, else
    ``runs/<config name>``), or None for one that only prints."""
    if words[:1] == ["PYTHONPATH=."]:
        words = words[1:]
    if words[1:2] not in (["fit"], ["cofed"]) or {"--help", "--print_config"} & set(words):
        return None
    if "--fast_dev_run" in words:  # its directory is a temporary one, deleted after
        return None
    flag = "--loop.run_dir" if words[1] == "fit" else "--run_dir"
    if flag in words:  # the last one counts, as for the parser
        return words[len(words) - 1 - words[::-1].index(flag) + 1]
    config = words[words.index("-c" if "-c" in words else "--config") + 1]
    return f"runs/{Path(config).stem}"


def test_each_readme_command_writes_a_run_directory_of_its_own():
    """Run top to bottom after ``make demo`` (which writes runs/quickstart), no command writes a
    run directory that an earlier one wrote (it would be refused: issue 26 found seven that
    did); the resume command continues the run directory its ``--ckpt_path`` is in."""
    written = {"runs/quickstart": "make demo"}
    for command in COMMANDS:
        words = shlex.split(command)
        run_dir = _run_dir_written(words)
        if run_dir is None:
            continue
        if "--ckpt_path" in words:
            assert words[words.index("--ckpt_path") + 1].startswith(f"{run_dir}/"), command
            assert run_dir in written, f"{command!r} resumes {run_dir}, which no command wrote"
            continue
        assert run_dir not in written, f"{command!r} writes {run_dir}, as {written[run_dir]!r} did"
        written[run_dir] = command


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_resolves(command, capsys, monkeypatch, tmp_path):
    words = shlex.split(command)
    if words[0] == "PYTHONPATH=.":
        monkeypatch.syspath_prepend(str(ROOT))
        words = words[1:]
    assert words[0] == "fedlightning"
    args = words[1:]
    if args[:1] == ["plot"]:
        pytest.skip("fedlightning plot reads run directories: tests/test_plots_scale.py runs it")
    if args[:1] == ["test"]:
        pytest.skip("fedlightning test reads a run directory: tests/test_rescore.py runs it")
    if "--ckpt_path" in args:
        pytest.skip("resuming needs a checkpoint: tests/test_resume_all.py resumes every config")
    monkeypatch.chdir(ROOT)
    sys.argv = ["fedlightning"]
    if args[:1] in (["fit"], ["cofed"]) and "--help" not in args:
        args = [*args, "--print_config"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out = capsys.readouterr()
    assert exit_info.value.code == 0, out.err
    assert out.out.strip()


def test_readme_plugin_block_is_the_example_file():
    section = README.split("## Adding an algorithm", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks == [(ROOT / "examples" / "plugins.py").read_text()]


@pytest.mark.slow  # a fresh process with Lightning's imports and three rounds
def test_readme_plugin_command_runs_as_shown(tmp_path):
    (command,) = [c for c in COMMANDS if "examples.plugins" in c]
    words = shlex.split(command)
    assert words[:2] == ["PYTHONPATH=.", "fedlightning"]
    # as the README shows it, from the repository root; `fedlightning` is this checkout's CLI
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([".", str(ROOT / "src")])}
    run_dir = tmp_path / "plugins"
    at = words.index("--loop.run_dir")  # the README's run directory, here a temporary one
    words[at + 1] = str(run_dir)
    done = subprocess.run(
        [sys.executable, "-m", "fedlightning.cli", *words[2:], "--loop.progress_bar", "false"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    config = (run_dir / "config.yaml").read_text()
    assert (
        "examples.plugins.LabelSmoothing" in config and "examples.plugins.ServerMomentum" in config
    )
    assert "done: round 3/3" in done.stderr

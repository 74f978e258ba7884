"""A key mistyped in one's own YAML file (issue 38 item 3): one line naming the file, the line, the
key and the closest valid names, before anything is written; a value given on the command line is
not blamed on a file that gives the same key."""

import sys
from pathlib import Path

import pytest

from fedlightning.cli import main
from fedlightning.errors import closest

ROOT = Path(__file__).parents[1]
QUICKSTART = (ROOT / "configs" / "quickstart.yaml").read_text()

#: case -> (the quickstart's text, the typo in its place, what the line says after "FILE, line N: ")
TYPOS = {
    "option of the loop": (
        "local_epochs: 2",
        "local_epoch: 2",
        "loop.local_epoch: loop takes no option local_epoch; the closest: local_epochs, "
        "local_steps (fedlightning fit --help lists them)",
    ),
    "option of the data": (
        "num_clients: 20",
        "num_client: 20",
        "data.num_client: data takes no option num_client; the closest: num_clients",
    ),
    "a group": (
        "loop:",
        "lop:",
        "lop: no group or option is called lop; the closest: loop (fedlightning fit --help",
    ),
    "option of the objective": (
        "lr: 0.05",
        "lrr: 0.05",
        "model.init_args.lrr: ClientModule takes no option lrr; the closest: lr",
    ),
    "option of the aggregator": (
        "weighting: samples",
        "weightin: samples",
        "loop.aggregator.init_args.weightin: FedAvg takes no option weightin; the closest: "
        "weighting",
    ),
    "value outside its choices": (
        "seed: 0",
        "seed: 0\n  on_round_failure: skipp",
        "loop.on_round_failure='skipp' is not allowed: choose one of skip, stop; the closest: skip",
    ),
}


def _refusal(args: list[str], tmp_path: Path, capsys) -> str:
    sys.argv = ["fedlightning"]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--loop.run_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith("fedlightning: error: "), err
    assert not (tmp_path / "run").exists()
    return err.removeprefix("fedlightning: error: ").strip()


@pytest.mark.parametrize(("right", "wrong", "expected"), list(TYPOS.values()), ids=list(TYPOS))
def test_a_typo_in_a_config_file_names_file_line_key_and_the_closest(
    right, wrong, expected, tmp_path, capsys
):
    assert QUICKSTART.count(right) == 1
    config = tmp_path / "mine.yaml"
    text = QUICKSTART.replace(right, wrong)
    config.write_text(text)
    key = wrong.splitlines()[-1].split(":")[0].strip()
    line = next(i for i, row in enumerate(text.splitlines(), 1) if row.strip().startswith(key))
    assert _refusal(["-c", str(config)], tmp_path, capsys).startswith(
        f"{config}, line {line}: {expected}"
    )


def test_the_file_named_is_the_one_holding_the_key(tmp_path, capsys):
    base, mine = tmp_path / "base.yaml", tmp_path / "mine.yaml"
    base.write_text(QUICKSTART)
    mine.write_text("# my changes\ndata:\n  beta: 0.1\n  num_client: 10\n")
    message = _refusal(["-c", str(base), "--config", str(mine)], tmp_path, capsys)
    assert message.startswith(f"{mine}, line 4: data.num_client: data takes no option")


def test_a_bad_value_on_the_command_line_is_not_blamed_on_the_file(tmp_path, capsys):
    config = tmp_path / "mine.yaml"
    config.write_text(QUICKSTART.replace("seed: 0", "seed: 0\n  on_round_failure: stop"))
    for given in (["--loop.on_round_failure", "skipp"], ["--loop.on_round_failure=skipp"]):
        message = _refusal(["-c", str(config), *given], tmp_path, capsys)
        assert message.startswith("loop.on_round_failure='skipp' is not allowed"), message


def test_closest_puts_the_name_spelt_in_other_case_first():
    names = ["FedAvgM", "FedNova", "FedAvg", "Krum"]
    assert closest("fedavg", names) == ["FedAvg", "FedAvgM", "FedNova"]
    assert closest("FEDAVGM", names)[0] == "FedAvgM"
    assert closest("fedav", names)[:2] == ["FedAvgM", "FedAvg"]  # no exact match: prefixes

"""One value per option (issue 33 item 2), below the CLI: which YAML texts and command lines say
two things (refused, naming the key and both lines or both values) and which are overrides or
list items (accepted). Through ``fit``, ``cofed`` and ``plot``: tests/test_bad_input.py,
tests/test_cofed_pipeline.py, tests/test_plot_inputs.py."""

import pytest

from fedlightning.config_checks import check_repeated_options, check_yaml_keys
from fedlightning.errors import ConfigurationError

SAID_ONCE = [
    "loop:\n  rounds: 2\nmodel:\n  rounds: 2\n",  # the same key in two mappings
    "base: &b {lr: 0.1}\nmodel:\n  <<: *b\n  lr: 0.2\n",  # a merge key, then an override
    "loggers:\n  - {save_dir: a}\n  - {save_dir: b}\n",  # one key per list item
    "loop: {rounds: 2\n",  # not YAML: the parser says so itself
]


@pytest.mark.parametrize("text", SAID_ONCE)
def test_a_key_said_once_per_mapping_is_accepted(text):
    check_yaml_keys(text, "c.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("loop:\n  rounds: 2\n  seed: 0\n  rounds: 3\n", r"c.yaml gives loop.rounds twice \(line 2 and line 4\)"),
        ("loop:\n  loggers:\n    - class_path: A\n      init_args: {save_dir: a, save_dir: b}\n",
         r"gives loop.loggers\[0\].init_args.save_dir twice \(line 4 and line 4\)"),
        ("seed: 0\nseed: 0\n", r"gives seed twice \(line 1 and line 2\)"),  # even with one value
    ],
)  # fmt: skip
def test_a_key_twice_in_one_mapping_is_refused_naming_it_and_both_lines(text, message):
    with pytest.raises(ConfigurationError, match=message):
        check_yaml_keys(text, "c.yaml")


@pytest.mark.parametrize(
    "argv",
    [
        ["-c", "a.yaml", "-c", "b.yaml", "--loop.rounds", "3"],  # files layer, the line overrides
        ["--loop.rounds", "3", "--loop.rounds=3"],  # twice, one value
        ["--loop.loggers+=A", "--loop.loggers.save_dir", "a",
         "--loop.loggers+=B", "--loop.loggers.save_dir", "b"],  # each new list item's options
        ["--print_config", "--loop.seed", "-1"],  # a flag; a value that starts with one dash
    ],
)  # fmt: skip
def test_overrides_list_items_and_one_value_twice_are_accepted(argv):
    check_repeated_options(argv)


def test_an_option_twice_with_two_values_is_refused_naming_both():
    with pytest.raises(ConfigurationError, match=(
        r"^--loop.aggregator is given twice on the command line, as 'fedlightning.server.Krum' "
        r"and as 'fedlightning.server.FedAvg': give it once"
    )):  # fmt: skip
        check_repeated_options(["--loop.aggregator", "fedlightning.server.Krum", "--loop.seed",
                                "1", "--loop.aggregator=fedlightning.server.FedAvg"])  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["--model.lr", "0.1", "--model.init_args.lr", "0.10"],  # two spellings, one value
        ["--model", "FedProx", "--model.class_path", "FedProx"],
        ["--loop.aggregator", "{class_path: FedAvgM, init_args: {server_momentum: 0.9}}",
         "--loop.aggregator.init_args.server_momentum", "0.9"],
        ["--loop.aggregator", "FedAvgM", "--loop.aggregator.server_momentum", "0.9"],  # a class, its option
        ["--loop.loggers+=A", "--loop.loggers.save_dir", "a",
         "--loop.loggers+=B", "--loop.loggers.init_args.save_dir", "b"],  # a new item, respelled
    ],
)  # fmt: skip
def test_one_value_in_several_spellings_is_accepted(argv):
    check_repeated_options(argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model.init_args.lr", "0.05", "--model.lr", "0.1"],
         r"^--model.init_args.lr '0.05' and --model.lr '0.1' set the same option \(model.lr\)"),
        (["--model", "FedProx", "--model.class_path", "FedAvg"],
         r"^--model 'FedProx' and --model.class_path 'FedAvg' set the same option \(model\)"),
        (["--model.init_args", "{lr: 0.1}", "--model.lr", "0.2"],
         r"^--model.init_args's lr '0.1' and --model.lr '0.2' set the same option \(model.lr\)"),
        (["--loop.aggregator.statistic", "{class_path: Krum, init_args: {byzantine: 2}}",
          "--loop.aggregator.init_args.statistic.init_args.byzantine", "3"],
         r"statistic's init_args.byzantine '2' and --loop.aggregator.init_args.statistic.init_args."
         r"byzantine '3' set the same option \(loop.aggregator.statistic.byzantine\)"),
        (["--model.network_kwargs", "{hidden: [64]}", "--model.network_kwargs", "{depth: 2}"],
         r"^--model.network_kwargs is given twice on the command line, as '\{hidden: \[64\]\}' "
         r"and as '\{depth: 2\}'"),  # a dict replaced whole: hidden would be lost
        (["--data.source_options", "{format: csv, format: json}"],
         r"^the value of --data.source_options gives format twice \(column 2 and column 15\)"),
    ],
)  # fmt: skip
def test_one_option_in_two_spellings_or_an_inline_key_twice_is_refused(argv, message):
    with pytest.raises(ConfigurationError, match=message):
        check_repeated_options(argv)


def test_a_group_file_then_the_command_line_is_an_override(tmp_path, capsys, monkeypatch):
    """``--loop FILE`` layers like ``-c``: a later ``--loop.rounds`` overrides its rounds."""
    import yaml

    from conftest import CONF
    from fedlightning.cli import main

    monkeypatch.setattr("sys.argv", ["fedlightning"])
    (tmp_path / "loop.yaml").write_text("rounds: 2\nclients_per_round: 3\n")
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", str(CONF / "tiny.yaml"), "--loop", str(tmp_path / "loop.yaml"),
              "--loop.rounds", "3", "--loop.run_dir", str(tmp_path / "run"), "--print_config"])  # fmt: skip
    assert stop.value.code == 0
    loop = yaml.safe_load(capsys.readouterr().out)["loop"]
    assert (loop["rounds"], loop["clients_per_round"]) == (3, 3)

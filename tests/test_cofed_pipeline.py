"""CoFED end to end at tiny size: image and tabular pipelines through ``fedlightning cofed``."""

import csv
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlightning.cli import main
from fedlightning.cofed import TabularTasks
from fedlightning.cofed.cli import build_parser

CONF = Path(__file__).parent / "conf"
CONFIGS = Path(__file__).parent.parent / "configs"


def run_cofed(run_dir: Path, *args: str, config: str = "cofed_tiny.yaml") -> list[dict[str, str]]:
    """``fedlightning cofed`` in-process on a test config; the rows of participants.csv."""
    sys.argv = ["fedlightning"]
    main(["cofed", "--config", str(CONF / config), "--run_dir", str(run_dir), *args])
    with open(run_dir / "participants.csv") as handle:
        return list(csv.DictReader(handle))


def test_image_pipeline_through_the_cli_writes_the_report(tmp_path, capsys):
    threads = torch.get_num_threads()
    rows = run_cofed(tmp_path / "run")
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("CoFED:")]
    assert line.endswith(f"run directory {tmp_path / 'run'}")  # off a terminal: not 80 columns
    assert torch.get_num_threads() == threads  # num_threads: 1 is restored after the run
    run = tmp_path / "run"
    assert len(rows) == 4
    optimizers = [r["model"].split("; ")[1].split()[0] for r in rows]
    assert optimizers == ["adam", "sgd", "adam", "sgd"]  # recipes cycle
    assert all(r["model"].startswith("cofed_cnn[") for r in rows)  # each its own random CNN
    for r in rows:
        local, cofed = float(r["local_acc"]), float(r["cofed_acc"])
        assert 0 <= local <= 1 and 0 <= cofed <= 1
        assert float(r["relative_acc"]) == pytest.approx(cofed / local)
    with open(run / "pseudo_labels.csv") as handle:
        table = list(csv.reader(handle))
    assert table[0] == ["participant", *(f"class_{c}" for c in range(5))]
    assert [sum(map(int, line[1:])) for line in table[1:]] == [
        int(r["pseudo_labels"]) for r in rows
    ]
    assert sum(int(r["pseudo_labels"]) for r in rows) > 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["public_size"] == 200 and summary["class_names"] == [
        "0/6",
        "1/7",
        "2/5",
        "3/8",
        "4/9",
    ]
    assert summary["mean_relative_acc"] == pytest.approx(
        np.mean([float(r["relative_acc"]) for r in rows])
    )
    assert "fedlightning.cofed.LabelSpaceTasks" in (run / "config.yaml").read_text()
    assert (run / "relative_accuracy.png").read_bytes()[:4] == b"\x89PNG"
    with open(run / "partition.csv") as handle:
        assert len(list(csv.reader(handle))) == 1 + 4


def test_same_seed_same_report_other_seed_differs(tmp_path):
    read = lambda name: (tmp_path / name / "participants.csv").read_bytes()  # noqa: E731
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        run_cofed(tmp_path / name, "--seed", seed, "--tasks.init_args.num_participants", "3")
    assert read("a") == read("b")
    assert read("a") != read("c")


def test_tabular_pipeline_through_the_cli(tmp_path):
    rows = run_cofed(tmp_path / "tab", config="cofed_tabular_tiny.yaml")
    assert [r["model"] for r in rows] == ["tree", "svm", "gam", "mlp"]
    assert all(int(r["num_train"]) == 60 and r["label_space"] == "0 1" for r in rows)
    assert all(0.5 < float(r["local_acc"]) <= 1 and 0.5 < float(r["cofed_acc"]) <= 1 for r in rows)
    # a strict majority of 4 needs 3 agreeing estimators; every participant gets the same labels
    assert len({r["pseudo_labels"] for r in rows}) == 1 and int(rows[0]["pseudo_labels"]) > 0


def test_tabular_public_rows_come_from_the_pooled_marginals():
    tasks = TabularTasks(num_participants=4, rows_per_participant=200, public_size=500)
    assert tasks.rows(426) == 106  # breast cancer's 426-row pool cannot give 4 x 200 rows
    data = tasks.build(seed=0)
    assert [len(t.train_y) for t in data.tasks] == [106] * 4
    pooled = torch.cat([t.train_x for t in data.tasks])
    for j in range(pooled.shape[1]):
        assert torch.isin(data.public_x[:, j], pooled[:, j]).all()
    # columns are drawn independently: public rows are (almost surely) not real rows
    assert not (data.public_x[:, None, :] == pooled[None]).all(-1).any()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alpha", "1.5"], r"alpha=1.5 is not allowed: expected a number in \[0, 1\]"),
        (["--margin", "2"], r"margin=2.0 is not allowed"),
        (["--tasks.init_args.num_participants", "0"], r"tasks.num_participants=0 is not allowed"),
        (
            ["--tasks.init_args.public_size", "100000"],
            r"public_size=100000 exceeds the \d+ samples",
        ),
        (
            ["--weights", "[1, 2]"],
            r"weights=\[1.0, 2.0\] is not allowed: expected null or one weight per participant \(4\)",
        ),
        (
            ["--weights", "[1, .inf, 1, 1]"],
            r"weights=\[1.0, inf, 1.0, 1.0\] is not allowed: expected null or finite numbers >= 0",
        ),
        (
            ["--participants.init_args.models", "[nope]"],
            r"participants.models=\['nope'\] is not allowed",
        ),
        (["--num_threads", "0"], r"num_threads=0 is not allowed"),
        # validated as fit validates its own (issue 33)
        (["--seed", "-1"], r"seed=-1 is not allowed: expected an integer in \[0, 4294967295\]"),
        (["--seed", str(2**32)], rf"seed={2**32} is not allowed"),
        (
            ["--seed", "1", "--seed", "2"],
            r"--seed is given twice on the command line, as '1' and as '2'",
        ),
    ]
    + (
        []
        if torch.cuda.is_available()
        else [
            (
                ["--participants.init_args.accelerator", "gpu"],
                r"participants.accelerator='gpu' but no CUDA GPU is available",
            )
        ]
    ),
)
def test_bad_options_exit_with_a_clear_message_before_training(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run_cofed(tmp_path / "bad", *args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err
    assert not (tmp_path / "bad" / "participants.csv").exists()


def test_a_cofed_config_with_a_key_twice_is_refused_naming_both_lines(tmp_path, capsys):
    text = (CONF / "cofed_tiny.yaml").read_text()
    config = tmp_path / "twice.yaml"
    config.write_text(text + "alpha: 0.9\n")  # the tiny config says alpha: 0.5 on line 5
    with pytest.raises(SystemExit) as exit_info:
        main(["cofed", "--config", str(config), "--run_dir", str(tmp_path / "bad")])
    assert exit_info.value.code == 2
    last = len(text.splitlines()) + 1
    assert re.search(
        rf"--config '.*twice.yaml' gives alpha twice \(line 5 and line {last}\) in one mapping",
        capsys.readouterr().err,
    )
    assert not (tmp_path / "bad").exists()


def test_bad_recipe_is_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cofed(tmp_path / "bad", "--participants.init_args.recipes", "[{lr: -1}]")
    assert exit_info.value.code == 2
    assert "recipe.lr=-1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "path",
    sorted(CONFIGS.glob("cofed*.yaml")) + sorted((CONFIGS / "experiments").glob("cofed*.yaml")),
    ids=str,
)
def test_shipped_cofed_configs_parse_and_instantiate(path):
    parser = build_parser()
    init = parser.instantiate(parser.parse_args(["--config", str(path)]))
    assert init.tasks is not None and init.participants is not None


def test_cifar100_config_is_on_the_papers_recipe():
    # Cao et al.: non-IID superclasses from 1 or 2 subclasses, local batch 50, update batch 1000
    parser = build_parser()
    init = parser.instantiate(
        parser.parse_args(["--config", str(CONFIGS / "experiments" / "cofed_cifar100.yaml")])
    )
    assert list(init.tasks.noniid_subclasses) == [1, 2] and init.tasks.public == "cifar10"
    assert tuple(init.tasks.classes_per_participant) == (6, 8)
    assert init.tasks.samples_per_class == 50
    recipes = init.participants.recipes
    assert {(r.batch_size, r.update_batch_size) for r in recipes} == {(50, 1000)}
    assert (init.alpha, init.margin) == (0.3, 0.3)


def _adult_rows(n: int, seed: int, test: bool) -> list[str]:
    """UCI Adult rows written by hand: income >50K exactly when education-num >= 12 and the
    weekly hours >= 40 (so a tree can learn it); some '?' values as in the real files."""
    rng = np.random.default_rng(seed)
    work = ["Private", "Self-emp-not-inc", "State-gov", "?"]
    rows = []
    for _ in range(n):
        edu, hours = int(rng.integers(5, 17)), int(rng.integers(20, 61))
        label = ">50K" if edu >= 12 and hours >= 40 else "<=50K"
        rows.append(
            f"{int(rng.integers(17, 80))}, {work[rng.integers(4)]}, {int(rng.integers(20000, 400000))}, "
            f"Bachelors, {edu}, Never-married, Adm-clerical, Not-in-family, White, "
            f"{['Male', 'Female'][rng.integers(2)]}, 0, 0, {hours}, United-States, {label}{'.' if test else ''}"
        )
    return rows


def write_adult(root: Path, train: int = 120, test: int = 40) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "adult.data").write_text("\n".join(_adult_rows(train, 0, False)) + "\n\n")
    (root / "adult.test").write_text(
        "|1x3 Cross validator\n" + "\n".join(_adult_rows(test, 1, True)) + "\n"
    )
    return root


def test_adult_files_are_read_and_one_hot_encoded(tmp_path):
    from fedlightning.cofed.adult import load_adult
    from fedlightning.errors import ConfigurationError

    root = tmp_path / "adult"
    root.mkdir()
    (root / "adult.data").write_text(
        "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K\n"
        "50, ?, 83311, HS-grad, 9, Married-civ-spouse, Exec-managerial, Husband, Black, Female, 0, 0, 13, Cuba, >50K\n"
    )
    (root / "adult.test").write_text(
        "|1x3 Cross validator\n"
        "25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Black, Male, 0, 0, 40, United-States, <=50K.\n"
    )
    train_x, train_y, test_x, test_y = load_adult(root)
    assert train_y.tolist() == [0, 1] and test_y.tolist() == [0]
    # 6 numeric columns, then one-hot blocks of 2 categories each (8 categorical columns)
    assert train_x.shape == (2, 6 + 8 * 2) and test_x.shape == (1, 22)
    assert train_x[0, :6].tolist() == [39, 77516, 13, 2174, 0, 40]
    assert train_x[0, 6:8].tolist() == [0, 1] and train_x[1, 6:8].tolist() == [
        1,
        0,
    ]  # ['?', 'State-gov']
    assert test_x[0, 6:8].tolist() == [0, 0]  # 'Private' never seen in adult.data
    assert test_x[0, 6 + 2 * 7 : 6 + 2 * 8].tolist() == [
        0,
        1,
    ]  # native-country: ['Cuba', 'United-States']
    (root / "adult.test").write_text("1, 2, 3\n")
    with pytest.raises(ConfigurationError, match="not a UCI Adult row"):
        load_adult(root)
    with pytest.raises(ConfigurationError, match="needs the UCI files"):
        load_adult(tmp_path / "nowhere")


def test_adult_through_the_tabular_pipeline(tmp_path):
    root = write_adult(tmp_path / "adult")
    rows = run_cofed(
        tmp_path / "run", "--tasks.init_args.dataset", "adult", "--tasks.init_args.root", str(root),
        "--tasks.init_args.rows_per_participant", "30", config="cofed_tabular_tiny.yaml",
    )  # fmt: skip
    assert [r["model"] for r in rows] == ["tree", "svm", "gam", "mlp"]
    assert all(int(r["num_train"]) == 30 for r in rows)  # 120 rows, 4 participants x 30
    assert all(0.0 <= float(r["local_acc"]) <= 1 and 0 <= float(r["cofed_acc"]) <= 1 for r in rows)
    assert max(float(r["local_acc"]) for r in rows) > 0.7  # the hand-written rule is learnable

"""CoFED's optional learning-rate re-search for update training (docs/algorithms.md section 3)."""

import csv
import re

import numpy as np
import pytest
import torch

from fedlightning.cofed.lr_search import choose, validation_split
from fedlightning.cofed.participants import TorchParticipants
from fedlightning.cofed.recipe import Recipe
from fedlightning.errors import ConfigurationError
from fedlightning.training import quiet_lightning
from test_cofed_pipeline import run_cofed


def _separable(n: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """Three classes, each a fixed random 8x8 pattern plus noise: easy to learn."""
    g = torch.Generator().manual_seed(seed)
    y = np.arange(n) % 3
    patterns = torch.randn(3, 1, 8, 8, generator=g)
    return patterns[torch.as_tensor(y)] + 0.5 * torch.randn(n, 1, 8, 8, generator=g), y


def _participant(factors, patience, update_epochs, lr=0.05):
    settings = TorchParticipants(
        models=["mlp"],
        recipes=[Recipe(optimizer="sgd", lr=lr, epochs=1, update_epochs=update_epochs)],
        accelerator="cpu",
        lr_search=True,
        lr_factors=factors,
        patience=patience,
    )
    return settings.build(0, 3, (1, 8, 8), seed=0)


def _read(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_validation_split_is_stratified_and_keeps_a_training_sample_per_class():
    y = np.array([0] * 10 + [1] * 5 + [2] * 2 + [3])
    rows = validation_split(y, 0.2, seed=3)
    assert np.bincount(y[rows], minlength=4).tolist() == [2, 1, 1, 0]
    assert rows.tolist() == validation_split(y, 0.2, seed=3).tolist()  # a function of the seed
    assert rows.tolist() != validation_split(y, 0.2, seed=4).tolist()


def test_the_chosen_candidate_has_the_best_validation_score():
    x, y = _separable(60, seed=0)
    participant = _participant([1e-3, 1.0], patience=3, update_epochs=15)
    with quiet_lightning():
        participant.fit(x, y, seed=0)
        participant.update_from(x, y, x[:0], y[:0], seed=1)
    tiny, base = participant.search_log
    assert (tiny.lr, base.lr) == pytest.approx((5e-5, 0.05))
    # lr 0.05 learns the patterns; lr 5e-5 barely moves from the one-epoch local model
    assert base.val_acc > tiny.val_acc and base.chosen and not tiny.chosen
    assert choose(list(participant.search_log)) == 1
    # the kept weights are the chosen candidate's best epoch: re-scoring gives its accuracy
    val = participant.validation_rows
    assert len(val) == 12  # 20% of each class's 20 samples
    assert participant.accuracy(x[val], y[val]) == pytest.approx(base.val_acc)


def test_early_stopping_stops_when_validation_stops_improving():
    # random labels: the training set is memorised while the validation score gets no better
    x, _ = _separable(60, seed=1)
    y = np.random.default_rng(0).integers(0, 3, size=60)
    participant = _participant([1.0], patience=2, update_epochs=40, lr=0.2)
    with quiet_lightning():
        participant.fit(x, y, seed=0)
        participant.update_from(x, y, x[:0], y[:0], seed=1)
    (run,) = participant.search_log
    assert run.epochs_run < 40
    assert run.epochs_run == run.best_epoch + 2  # stopped exactly `patience` epochs after the best


def test_choose_prefers_accuracy_then_loss_then_the_first_listed():
    from fedlightning.cofed.lr_search import Candidate

    def c(acc, loss):
        return Candidate(1.0, 0.1, 1, 1, acc, loss)

    assert choose([c(0.5, 0.1), c(0.75, 2.0), c(0.75, 1.0)]) == 2
    assert choose([c(0.5, 1.0), c(0.5, 1.0)]) == 0


def test_lr_search_through_the_cli_is_deterministic(tmp_path):
    args = [
        "--participants.init_args.lr_search", "true",
        "--participants.init_args.patience", "1",
        "--participants.init_args.recipes",
        "[{optimizer: adam, lr: 0.01, epochs: 3, update_epochs: 4}]",
    ]  # fmt: skip
    rows = run_cofed(tmp_path / "a", *args)
    search = _read(tmp_path / "a" / "lr_search.csv")
    updated = [r["participant"] for r in rows if int(r["pseudo_labels"]) > 0]
    assert updated  # the tiny run labels something for someone
    assert sorted({s["participant"] for s in search}) == sorted(updated)
    for p in updated:
        cands = [s for s in search if s["participant"] == p]
        assert [float(s["factor"]) for s in cands] == [1.0, 0.1, 2.0]
        assert [float(s["lr"]) for s in cands] == pytest.approx([0.01, 0.001, 0.02])
        assert all(1 <= int(s["epochs_run"]) <= 4 for s in cands)
        scores = [(float(s["val_acc"]), -float(s["val_loss"])) for s in cands]
        assert [s["chosen"] for s in cands].count("True") == 1
        chosen = next(k for k, s in enumerate(cands) if s["chosen"] == "True")
        assert scores[chosen] == max(scores)
    again = run_cofed(tmp_path / "b", *args)
    assert _read(tmp_path / "b" / "lr_search.csv") == search
    assert [r["cofed_acc"] for r in again] == [r["cofed_acc"] for r in rows]


def test_without_lr_search_no_search_file_is_written(tmp_path):
    run_cofed(tmp_path / "plain", "--tasks.init_args.num_participants", "2")
    assert not (tmp_path / "plain" / "lr_search.csv").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--participants.init_args.lr_factors", "[1, -0.1]"], r"participants.lr_factors=\[1.0, -0.1\]"),
        (["--participants.init_args.lr_factors", "[]"], r"participants.lr_factors=\[\]"),
        (["--participants.init_args.lr_factors", "[1, 1]"], r"participants.lr_factors=\[1.0, 1.0\]"),
        (["--participants.init_args.patience", "0"], r"participants.patience=0 is not allowed"),
        (["--participants.init_args.val_fraction", "1.5"], r"participants.val_fraction=1.5"),
    ],
)  # fmt: skip
def test_bad_search_options_exit_2_before_training(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run_cofed(tmp_path / "bad", "--participants.init_args.lr_search", "true", *args)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "bad" / "participants.csv").exists()


def test_a_participant_without_two_samples_of_any_class_cannot_hold_validation_out():
    participant = _participant([1.0], patience=1, update_epochs=1)
    with pytest.raises(ConfigurationError, match="participants.lr_search"):
        participant.fit(torch.randn(3, 1, 8, 8), np.array([0, 1, 2]), seed=0)

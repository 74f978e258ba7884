"""FedProx's synthetic(alpha, beta) data (issue 41 item 6a; docs/algorithms.md section 6.5):
each device's labels are a linear model's argmax (a linear classifier separates them), its
inputs have the stated diagonal covariance j^-1.2, the sizes and the 90/10 split are the
authors', the partition is the devices, and bad options are refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from fedlightning.data.fedprox_synthetic import load_fedprox_synthetic
from fedlightning.errors import ConfigurationError


@pytest.fixture(scope="module")
def split():
    return load_fedprox_synthetic(0, {"alpha": 1.0, "beta": 1.0, "devices": 30})


def test_each_devices_labels_are_a_linear_models_argmax(split):
    """A linear classifier separates each device's labels exactly, on the devices with at least
    three samples per parameter (61 per class present), where the same labels shuffled are not
    separable (the control)."""
    devices = split.client_ids
    x, y = split.train_x.numpy().astype(np.float64), split.train_y.numpy()
    checked = 0
    for k in range(30):
        xs, ys = x[devices == k], y[devices == k]
        if len(xs) < 3 * 61 * len(set(ys)):
            continue
        checked += 1
        fitted = LogisticRegression(C=1e4, max_iter=5000).fit(xs, ys)
        assert fitted.score(xs, ys) == 1.0, k
        shuffled = np.random.default_rng(k).permutation(ys)
        control = LogisticRegression(C=1e4, max_iter=5000).fit(xs, shuffled)
        assert control.score(xs, shuffled) < 0.99, k
    assert checked >= 2


def test_inputs_have_the_stated_covariance_and_the_authors_sizes(split):
    devices = split.client_ids
    counts = np.bincount(devices, minlength=30)
    assert counts.min() >= int(0.9 * 50) and len(counts) == 30
    assert len(split.test_y) + len(split.train_y) >= 30 * 50
    largest = np.argmax(counts)
    x = split.train_x.numpy().astype(np.float64)[devices == largest]
    assert len(x) > 400
    variance = x.var(axis=0, ddof=1)
    for j in (1, 2, 10, 60):  # Sigma_jj = j^-1.2, within sampling error
        assert variance[j - 1] == pytest.approx(j**-1.2, rel=0.2), j


def test_a_run_partitions_by_device_and_learns(cli, tmp_path):
    """30 devices, multinomial logistic regression: each client holds one device's samples and
    a few rounds beat chance (10 classes) clearly."""
    rows = cli(tmp_path, "--data.dataset", "fedprox_synthetic", "--data.partition", "natural",
               "--data.num_clients", "30", "--model.init_args.network_kwargs", "{hidden: []}",
               "--loop.clients_per_round", "10", "--loop.rounds", "4", "--loop.local_epochs",
               "5", "--loop.plots", "false")  # fmt: skip
    assert float(rows[-1]["test_acc"]) > 0.25


def test_bad_options_are_refused_in_one_line():
    with pytest.raises(ConfigurationError, match=r"\['gamma'\] is not an option"):
        load_fedprox_synthetic(0, {"gamma": 1})
    with pytest.raises(ConfigurationError, match=r"alpha=-1 is not allowed"):
        load_fedprox_synthetic(0, {"alpha": -1})

"""IFCA (Ghosh et al., NeurIPS 2020, arXiv:2006.04088, Algorithm 1) recomputed by hand from the
paper's equations on hand-made tensors: the server's two options over two rounds (the cluster
models and the declared assignment) with clients owning different keys, the client's cluster
estimate ``argmin_j F_i(theta_j)`` by hand-computed cross-entropies, and the planted clusters of
a federation recovered through the loop."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from clustered_data import NET, planted
from fedlightning import FederatedLoop
from fedlightning.clients import IFCAClient
from fedlightning.clients.ifca import select_cluster
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload, Upload
from fedlightning.server import IFCA
from fedlightning.server.base import ClientKeys

T = torch.float64


def _t(*values):
    return torch.tensor(values, dtype=T)


def _server(k=2, update="model", weighting="uniform"):
    """Three clients: 0 owns w, 1 and 2 own w and deep; two cluster models set by hand."""
    initial = {"w": _t(0.0, 0.0), "deep": _t(0.0)}
    keys = [ClientKeys("small", frozenset({"w"})), ClientKeys("big", frozenset(initial)),
            ClientKeys("big", frozenset(initial))]  # fmt: skip
    agg = IFCA(num_clusters=k, update=update, weighting=weighting)
    agg.setup(initial, 3, client_keys=keys)
    agg.set_initial_states(
        [{"w": _t(1.0, 2.0), "deep": _t(3.0)}, {"w": _t(-1.0, 0.0), "deep": _t(5.0)}]
    )
    return agg


def _up(cid, cluster, n=1, **weights):
    return Upload(cid, {k: _t(*v) for k, v in weights.items()}, n, 1, extras={"cluster": cluster})


def test_model_averaging_two_rounds_by_hand():
    """Option II: each cluster model becomes its members' mean (per key over its owners); a
    cluster nobody picked keeps its model; the assignment is each client's last pick."""
    agg = _server()
    assert agg.assignment == [-1, -1, -1]
    agg.aggregate(0, [_up(0, 1, w=(2.0, 2.0)), _up(1, 1, w=(4.0, 0.0), deep=(7.0,)),
                      _up(2, 0, w=(0.0, 1.0), deep=(1.0,))])  # fmt: skip
    assert agg.models[1]["w"].tolist() == [3.0, 1.0] and agg.models[1]["deep"].tolist() == [7.0]
    assert agg.models[0]["w"].tolist() == [0.0, 1.0] and agg.models[0]["deep"].tolist() == [1.0]
    assert agg.assignment == [1, 1, 0]
    assert agg.round_metrics() == {"ifca_clients_0": 1.0, "ifca_clients_1": 2.0}
    deployed = agg.deployables()
    assert deployed["global"] is agg.models[1]  # the cluster most clients picked
    assert set(deployed) == {"global", "cluster_0", "cluster_1", "small", "big"}
    agg.aggregate(1, [_up(0, 0, w=(5.0, 5.0))])  # client 0 moves; cluster 1 is nobody's
    assert agg.models[0]["w"].tolist() == [5.0, 5.0] and agg.models[0]["deep"].tolist() == [1.0]
    assert agg.models[1]["w"].tolist() == [3.0, 1.0]
    assert agg.assignment == [0, 1, 0]
    assert agg.global_state() is agg.models[0]


def test_model_averaging_weights_by_samples():
    agg = _server(weighting="samples")
    agg.aggregate(
        0, [_up(1, 0, 1, w=(0.0, 0.0), deep=(0.0,)), _up(2, 0, 3, w=(4.0, 8.0), deep=(4.0,))]
    )
    assert agg.models[0]["w"].tolist() == [3.0, 6.0] and agg.models[0]["deep"].tolist() == [3.0]


def test_gradient_averaging_two_rounds_by_hand():
    """Option I: theta_j + (1/m_p) sum over its members of (theta_i - theta_j), m_p the uploads
    of the round owning p (every cluster's): theta_j - (gamma/m) sum_i s_ij g_i."""
    agg = _server(update="gradient")
    agg.aggregate(0, [_up(0, 1, w=(2.0, 2.0)), _up(1, 1, w=(4.0, 0.0), deep=(7.0,)),
                      _up(2, 0, w=(0.0, 1.0), deep=(1.0,))])  # fmt: skip
    # cluster 1 from (-1, 0), deep 5: w += ((3, 2) + (5, 0)) / 3; deep += (7 - 5) / 2
    assert agg.models[1]["w"].tolist() == pytest.approx([-1 + 8 / 3, 2 / 3], abs=1e-15)
    assert agg.models[1]["deep"].tolist() == pytest.approx([6.0], abs=1e-15)
    # cluster 0 from (1, 2), deep 3: w += (-1, -1) / 3; deep += (1 - 3) / 2
    assert agg.models[0]["w"].tolist() == pytest.approx([1 - 1 / 3, 2 - 1 / 3], abs=1e-15)
    assert agg.models[0]["deep"].tolist() == pytest.approx([2.0], abs=1e-15)
    w0 = agg.models[0]["w"].clone()
    agg.aggregate(1, [_up(0, 0, w=(5.0, 5.0))])  # one upload: the full step
    assert agg.models[0]["w"].tolist() == pytest.approx([5.0, 5.0], abs=1e-15)
    assert agg.models[0]["deep"].tolist() == pytest.approx([2.0], abs=1e-15)
    assert not torch.equal(w0, agg.models[0]["w"])


def test_payload_carries_every_cluster_model_once():
    agg = _server()
    payloads = agg.configure_round(0, [0, 1])
    small, big = payloads[0], payloads[1]
    assert set(small.weights) == {"w"} and torch.equal(small.weights["w"], _t(1.0, 2.0))
    assert [set(m) for m in small.extras["clusters"]] == [{"w"}]
    assert torch.equal(big.extras["clusters"][0]["deep"], _t(5.0))


class _Data:
    """What IFCAClient reads of a data module: each client's training samples, the eval batch."""

    def __init__(self, x, y, eval_batch_size=2):
        self.x, self.y, self.eval_batch_size = x, y, eval_batch_size

    def client_train_dataloader(self, client_id, seed):
        return SimpleNamespace(x=self.x, y=self.y)


def _cross_entropy(weight, bias, x, y):
    """The mean cross-entropy in plain Python: log sum exp(z) - z_y."""
    total = 0.0
    for row, label in zip(x.tolist(), y.tolist(), strict=True):
        z = [sum(w * v for w, v in zip(wr, row, strict=True)) + b
             for wr, b in zip(weight.tolist(), bias.tolist(), strict=True)]  # fmt: skip
        total += math.log(sum(math.exp(v) for v in z)) - z[label]
    return total / len(y)


def test_client_picks_the_cluster_with_the_lowest_training_loss():
    x = _t(1.0, 0.0, 0.0, 1.0, 1.0, 1.0).reshape(3, 2)
    y = torch.tensor([0, 1, 1])
    models = [{"weight": _t(1.0, 0.0, 0.0, 1.0).reshape(2, 2), "bias": _t(0.0, 0.0)},
              {"weight": _t(-1.0, 0.0, 0.0, -1.0).reshape(2, 2), "bias": _t(0.0, 0.5)},
              {"weight": _t(2.0, -1.0, -1.0, 2.0).reshape(2, 2), "bias": _t(0.0, 0.0)}]  # fmt: skip
    by_hand = [_cross_entropy(m["weight"], m["bias"], x, y) for m in models]
    client = IFCAClient(network=nn.Linear(2, 2).double(), num_classes=2)
    client.prepare_clients(_Data(x, y))
    losses = client.cluster_losses(0, models)
    assert losses == pytest.approx(by_hand, abs=1e-14)
    client.begin_client(0, Payload(models[0], extras={"clusters": models[1:]}), {})
    chosen = min(range(3), key=lambda j: by_hand[j])
    assert chosen != 0  # the test means something: the pick is not the payload's own weights
    assert torch.equal(client.network.weight.detach(), models[chosen]["weight"])
    assert client.network.training  # evaluated in eval mode, handed back in train mode
    _, extras, _ = client.end_client(num_steps=0)
    assert extras == {"cluster": chosen}


def test_selection_ties_go_to_the_smallest_index_and_nan_loses():
    assert select_cluster([1.0, 1.0]) == 0
    assert select_cluster([float("nan"), float("nan")]) == 0
    assert select_cluster([float("nan"), 5.0, 4.0]) == 2


def test_the_loop_recovers_planted_clusters(tmp_path):
    """Half the clients see shifted labels: with every client every round, after 6 rounds each
    half has picked its own cluster (two tasks, two models)."""
    torch.manual_seed(0)
    loop = FederatedLoop(rounds=6, clients_per_round=8, local_epochs=2, aggregator=IFCA(),
                         run_dir=str(tmp_path), progress_bar=False, plots=False)  # fmt: skip
    loop.fit(IFCAClient(**NET), datamodule=planted())
    first, second = loop.aggregator.assignment[:4], loop.aggregator.assignment[4:]
    assert len(set(first)) == 1 and len(set(second)) == 1 and first[0] != second[0]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: IFCA(num_clusters=1), r"num_clusters=1 .*an integer >= 2"),
        (lambda: IFCA(update="models"), r"update='models' .*model or gradient"),
        (lambda: IFCA(weighting="sizes"), r"weighting='sizes'"),
    ],
)
def test_bad_options_are_refused_in_one_line(make, message):
    with pytest.raises(ConfigurationError, match=message) as error:
        make()
    assert "\n" not in str(error.value)


def test_an_upload_without_a_valid_cluster_is_that_clients_error():
    agg = _server()
    with pytest.raises(ValueError, match="client 2 uploaded cluster 7"):
        agg.aggregate(0, [_up(2, 7, w=(0.0, 0.0), deep=(0.0,))])

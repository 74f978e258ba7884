import pytest
import torch

from fedlightning.protocol import Upload
from fedlightning.server import FedAvg
from fedlightning.server.functional import weighted_average


def _state(w, b, steps):
    return {
        "w": torch.tensor(w),
        "bn.running_mean": torch.tensor(b),
        "bn.num_batches_tracked": torch.tensor(steps),
    }


def _uploads():
    return [
        Upload(0, _state([[1.0, 2.0], [3.0, 4.0]], [0.5], 7), num_samples=10, num_steps=3),
        Upload(1, _state([[5.0, 6.0], [7.0, 8.0]], [1.5], 9), num_samples=30, num_steps=9),
    ]


def test_fedavg_is_the_sample_weighted_mean_with_integer_buffers_untouched():
    agg = FedAvg()
    agg.setup(_state([[0.0, 0.0], [0.0, 0.0]], [0.0], 0), num_clients=2)
    agg.aggregate(0, _uploads())
    out = agg.global_state()
    # hand-computed: 0.25 * first + 0.75 * second
    assert torch.allclose(out["w"], torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    assert torch.allclose(out["bn.running_mean"], torch.tensor([1.25]))
    assert out["bn.num_batches_tracked"].dtype == torch.int64
    assert out["bn.num_batches_tracked"].item() == 7  # taken from the first upload, not averaged


def test_fedavg_uniform_weighting():
    agg = FedAvg(weighting="uniform")
    agg.setup(_state([[0.0, 0.0], [0.0, 0.0]], [0.0], 0), num_clients=2)
    agg.aggregate(0, _uploads())
    assert torch.allclose(agg.global_state()["w"], torch.tensor([[3.0, 4.0], [5.0, 6.0]]))


def test_every_client_gets_the_global_model_and_state_round_trips():
    agg = FedAvg()
    agg.setup(_state([[1.0, 1.0], [1.0, 1.0]], [0.0], 0), num_clients=5)
    payloads = agg.configure_round(0, [3, 1])
    assert set(payloads) == {3, 1}
    assert all(torch.equal(p.weights["w"], torch.ones(2, 2)) for p in payloads.values())
    agg.aggregate(0, _uploads())
    clone = FedAvg()
    clone.load_state_dict(agg.state_dict())
    assert all(torch.equal(clone.global_state()[k], v) for k, v in agg.global_state().items())


def test_weighted_average_refuses_mismatched_keys_and_bad_weights():
    a, b = {"w": torch.ones(2)}, {"v": torch.ones(2)}
    with pytest.raises(ValueError, match="different keys"):
        weighted_average([a, b], [1, 1])
    with pytest.raises(ValueError, match="positive"):
        weighted_average([a, a], [0, 0])


def test_weighting_is_validated():
    with pytest.raises(ValueError, match="weighting.*'samples' or 'uniform'.*'sizes'"):
        FedAvg(weighting="sizes")

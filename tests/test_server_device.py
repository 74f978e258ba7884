"""Server state on the run's device (docs/algorithms.md section 2.1, "Accumulation"; issue 14
item 4): every registered aggregator computes on the device of the tensors it is given, keeps its
state there and restores it there; the compensated float32 sum used where a device has no
float64 is as exact as the float64 mean; the loop's placement helpers move what crosses a
process or goes to a file. The ``meta`` device checks device propagation without compute: a
hard-coded CPU tensor or ``.cpu()`` inside an aggregator fails there. A CUDA run at the end
(skipped without CUDA) checks the whole loop on a GPU against a CPU run.
"""

import inspect

import pytest
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from fedlightning import FederatedDataModule, FederatedLoop, server
from fedlightning.backends import CohortBackend, SequentialBackend
from fedlightning.clients import ClientModule, ScaffoldClient
from fedlightning.loop.checkpoint import read_checkpoint
from fedlightning.loop.server_device import ServerDevice
from fedlightning.placement import move, to_cpu
from fedlightning.protocol import ClientJob, FitResult, Payload, Upload
from fedlightning.server import summation
from fedlightning.server.functional import weighted_average
from fedlightning.server.summation import WeightedSum, two_product, two_sum, weighted_sum
from objective_helpers import SYNTHETIC, synthetic_run

AGGREGATORS = [
    getattr(server, n) for n in server.__all__ if not inspect.isabstract(getattr(server, n))
]
#: a ResNet-like state (InCo finds its layer pairs) with BatchNorm statistics and an integer buffer
SHAPES = {
    "layer1.0.conv1.weight": (4, 4, 3, 3), "layer1.0.conv2.weight": (4, 4, 3, 3),
    "layer1.1.conv1.weight": (4, 4, 3, 3), "layer1.1.conv2.weight": (4, 4, 3, 3),
    "bn.weight": (4,), "bn.bias": (4,), "bn.running_mean": (4,), "bn.running_var": (4,),
    "fc.weight": (3, 4), "fc.bias": (3,),
}  # fmt: skip


def _state(device, seed):
    g = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    state["bn.running_var"] = state["bn.running_var"].abs()
    state["bn.num_batches_tracked"] = torch.tensor(seed)
    return {k: v.to(device) for k, v in state.items()}


def _aggregator(cls):
    """``cls()``; FedCross with ``in_order`` collaborators where its default selection would read
    similarity values back (impossible on ``meta``; the maths of the other rules are the same)."""
    if cls is server.FedCross:
        return cls(selection="in_order")
    return cls()


def _extras(aggregator, state):
    out = {}
    for name in aggregator.required_upload_extras:
        if name == "delta_c":
            out[name] = {k: v * 0.01 for k, v in state.items() if v.is_floating_point()}
        elif name == "a":
            out[name] = 2.0
        elif name == "cluster":  # IFCA: the cluster the client picked
            out[name] = 1
        else:  # a new aggregator's extra: teach this test what a client uploads for it
            raise AssertionError(f"{type(aggregator).__name__} needs upload extra {name!r}")
    return out


def _rounds(aggregator, device, rounds=2):
    """Two rounds of 2 of 4 clients on ``device``; returns every tensor the aggregator exposed."""
    aggregator.setup(_state(device, 0), num_clients=4, seed=0)
    needed = aggregator.initial_states_needed(2)
    if needed:
        aggregator.set_initial_states([_state(device, 10 + i) for i in range(needed)])
    seen = []
    for r in range(rounds):
        ids = [r, r + 2]
        payloads = aggregator.configure_round(r, ids)
        seen += [payloads[c].weights for c in ids] + [payloads[c].extras for c in ids]
        uploads = []
        for i, cid in enumerate(ids):
            trained = {
                k: v + 0.1 * (i + 1) if v.is_floating_point() else v + 1
                for k, v in payloads[cid].weights.items()
            }
            uploads.append(
                Upload(cid, trained, 10 * (i + 1), 5, _extras(aggregator, trained),
                       payloads[cid].model_index)
            )  # fmt: skip
        aggregator.aggregate(r, uploads)
        seen += [aggregator.global_state(), aggregator.deployables(), aggregator.state_dict()]
    return seen


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensors(v)


class _MetaReads(TorchFunctionMode):
    """Answers a read of a meta tensor's values (``item``, ``tolist``, ``float``, ``int``,
    ``bool``) as if every value were 1: the meta device has no values, and a rule that decides by
    them (Krum's choice, Weiszfeld's stopping rule, a clipping norm) must still place what it
    computes on its inputs' device, which is what is checked here, whatever it decided."""

    READS = (Tensor.item, Tensor.tolist, Tensor.__float__, Tensor.__int__, Tensor.__bool__)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS and args[0].device.type == "meta":
            return func(torch.ones(args[0].shape, dtype=args[0].dtype))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("cls", AGGREGATORS, ids=lambda c: c.__name__)
def test_every_aggregator_keeps_its_state_on_the_device_of_its_inputs(cls):
    aggregator = _aggregator(cls)
    with _MetaReads():
        seen = _rounds(aggregator, "meta")
    devices = {t.device.type for t in _tensors(seen)}
    assert devices == {"meta"}, f"{cls.__name__} put server state on {devices}"
    # a resume: the checkpoint's state (CPU in the file) placed on the server device and loaded
    restored = _aggregator(cls)
    restored.setup(_state("meta", 0), num_clients=4, seed=0)
    restored.load_state_dict(ServerDevice("meta").place(aggregator.state_dict()))
    after = [restored.state_dict(), restored.global_state(), restored.configure_round(2, [0, 1])]
    payload_tensors = [t for p in after[2].values() for t in _tensors([p.weights, p.extras])]
    assert {t.device.type for t in [*_tensors(after[:2]), *payload_tensors]} == {"meta"}


class _NoFloat64(TorchFunctionMode):
    """Fails any torch call that makes a float64 tensor (what a device without float64 refuses)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in _tensors(out if isinstance(out, list | tuple) else [out]):
            if t.dtype == torch.float64:
                raise AssertionError(f"{func} made a float64 tensor")
        return out


@pytest.mark.parametrize("cls", AGGREGATORS, ids=lambda c: c.__name__)
def test_every_aggregator_runs_without_float64_and_agrees_with_it(cls, monkeypatch):
    """With float64 declared missing (as on MPS), no aggregator makes a float64 tensor, and the
    result equals the float64 path's to float32 tolerance."""
    with_float64 = _rounds(cls(), "cpu")
    monkeypatch.setattr(summation, "supports_float64", lambda device: False)
    with _NoFloat64():
        without = _rounds(cls(), "cpu")
    for a, b in zip(_tensors(with_float64), _tensors(without), strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(b, a, rtol=2e-6, atol=2e-6)


def _adversarial(k=128, n=4096, seed=0):
    """K float32 models whose mean cancels: 1e6 in the first half, -1e6 in the second, plus a
    signal in [1, 1.5) (a naive float32 sum loses the signal to the large partial sums). With
    K = 128 the coefficients 1/K are exact and the float64 accumulation of these terms is exact
    too (about 31 significant bits), so the float64 path is the exact mean, rounded once."""
    g = torch.Generator().manual_seed(seed)
    signs = torch.tensor([1.0, -1.0]).repeat_interleave(k // 2)
    states = [(s * 1e6 + 1 + 0.5 * torch.rand(n, generator=g)).float() for s in signs]
    return states, [1.0 / k] * k


def _ulps(x, reference):
    """|x - reference| in units of float32's spacing at the reference (float64)."""
    spacing = torch.finfo(torch.float32).eps * reference.abs().clamp_min(2**-126)
    return ((x.double() - reference) / spacing).abs()


def test_compensated_float32_sum_equals_the_float64_mean_where_a_naive_sum_does_not():
    states, weights = _adversarial()
    exact = weighted_sum(states, weights, torch.float64, compensated=False)
    compensated = weighted_sum(states, weights, torch.float32, compensated=True)
    naive = torch.zeros_like(states[0])
    for w, s in zip(weights, states, strict=True):
        naive += w * s
    # within float32 rounding of the exact mean, as the float64 path (0.5 ulp)
    assert _ulps(exact.float(), exact).max() <= 0.5
    assert _ulps(compensated, exact).max() <= 1.0
    assert (compensated == exact.float()).float().mean() >= 0.99
    assert _ulps(naive, exact).max() > 1000  # the cancellation a naive float32 sum suffers


def test_weighted_average_without_float64_is_within_rounding_of_the_float64_mean(monkeypatch):
    states, _ = _adversarial(k=40)
    weights = [1.0 + i % 20 for i in range(40)]  # client i and i + 20 alike: +-1e6 cancel
    exact = weighted_average([{"w": s.double()} for s in states], weights)["w"]
    monkeypatch.setattr(summation, "supports_float64", lambda device: False)
    assert WeightedSum((1,), "cpu").compensated
    mean = weighted_average([{"w": s} for s in states], weights)["w"]
    assert mean.dtype == torch.float32
    assert _ulps(mean, exact).max() <= 1.0
    naive = sum(w / sum(weights) * s for w, s in zip(weights, states, strict=True))
    assert _ulps(naive, exact).max() > 1000


def test_error_free_transformations_are_exact():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(1000, generator=g) * 1e3, torch.randn(1000, generator=g)
    s, e = two_sum(a, b)
    assert torch.equal(s.double() + e.double(), a.double() + b.double())
    p, e = two_product(a, b)
    assert torch.equal(p.double() + e.double(), a.double() * b.double())


def test_float64_path_is_the_plain_float64_accumulation():
    """On a device with float64 the sum is the float64 accumulation rounded once (what CPU runs
    always did): bit for bit."""
    states, weights = _adversarial(k=10)
    acc = torch.zeros(states[0].shape, dtype=torch.float64)
    for w, s in zip(weights, states, strict=True):
        acc.add_(s.double(), alpha=w)
    assert torch.equal(weighted_sum(states, weights, torch.float32), acc.float())


def test_move_keeps_sharing_and_is_a_no_op_on_the_same_device():
    payload = Payload({"w": torch.ones(2)}, {"c": {"w": torch.zeros(2)}})
    jobs = [ClientJob(0, 1, payload, {}), ClientJob(0, 2, payload, {"x": torch.ones(1)})]
    assert to_cpu(jobs) is jobs  # nothing to move: the same objects, no copies
    moved = move(jobs, "meta")
    assert moved[0].payload is moved[1].payload  # one payload for both jobs, moved once
    assert moved[0].payload.extras["c"]["w"].device.type == "meta"
    assert moved[1].state["x"].device.type == "meta"
    assert jobs[0].payload.weights["w"].device.type == "cpu"  # the original is untouched


def test_copy_snapshots_every_tensor_and_container_keeping_sharing():
    weight = torch.ones(2, requires_grad=True)
    shared = torch.zeros(3)
    state = {"w": weight, "pair": (shared, shared), "meta": {"step": 1}}
    snap = to_cpu(state, copy=True)
    assert snap is not state and snap["meta"] is not state["meta"]  # new containers
    assert snap["w"].data_ptr() != weight.data_ptr() and not snap["w"].requires_grad
    assert snap["pair"][0] is snap["pair"][1]  # shared inside the value: shared in the copy
    shared.add_(5.0)  # training in place after the snapshot cannot reach it
    assert torch.equal(snap["pair"][0], torch.zeros(3))


def test_arrivals_move_uploads_to_the_server_device_and_leave_client_state():
    upload = Upload(3, {"w": torch.ones(2)}, 5, 1, {"delta_c": {"w": torch.zeros(2)}})
    results = {3: FitResult(upload, {"c_i": torch.ones(2)}), 4: RuntimeError("failed")}
    arrived = ServerDevice("meta").arrivals(results)
    assert arrived[3].upload.weights["w"].device.type == "meta"
    assert arrived[3].upload.extras["delta_c"]["w"].device.type == "meta"
    assert arrived[3].state["c_i"].device.type == "cpu"  # the ClientStore's, off the accelerator
    assert arrived[4] is results[4]


def test_checkpoint_files_hold_cpu_tensors_and_resume_on_the_server_device(tmp_path):
    loop = synthetic_run(ScaffoldClient(**SYNTHETIC), server.Scaffold(), 2, tmp_path, plots=False)
    checkpoint = read_checkpoint(str(tmp_path / "last.ckpt"))
    assert {t.device.type for t in _tensors(checkpoint)} == {"cpu"}
    aggregator = server.Scaffold()
    aggregator.setup(move(loop.aggregator.global_state(), "meta"), num_clients=4)
    aggregator.load_state_dict(ServerDevice("meta").place(checkpoint["aggregator"]))
    assert {t.device.type for t in _tensors(aggregator.state_dict())} == {"meta"}


def _recording(cls):
    """``cls`` recording where its state is at the start of every round (``devices``)."""

    class Recording(cls):
        transient_attributes = frozenset({"devices"})  # the test's record

        def configure_round(self, round_index, client_ids):
            self.devices = getattr(self, "devices", [])
            self.devices += [t.device.type for t in _tensors(self.state_dict())]
            return super().configure_round(round_index, client_ids)

    return Recording


CUDA_CASES = {
    # SCAFFOLD's c beside the model, fitted one client at a time
    "scaffold-sequential": (ScaffoldClient, server.Scaffold, SequentialBackend),
    # FedCross's middleware models and similarity-based collaborators, the cohort backend's uploads
    "fedcross-cohort": (ClientModule, server.FedCross, CohortBackend),
}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", CUDA_CASES)
def test_cuda_run_keeps_server_state_on_the_gpu_and_matches_a_cpu_run(case, tmp_path):
    objective, aggregator, backend = CUDA_CASES[case]

    def run(accelerator, rounds, ckpt_path=None):
        torch.manual_seed(0)
        loop = FederatedLoop(
            rounds=rounds, clients_per_round=2, aggregator=_recording(aggregator)(),
            accelerator=accelerator, backend=backend(), run_dir=str(tmp_path / accelerator),
            progress_bar=False, plots=False,
        )  # fmt: skip
        dm = FederatedDataModule(
            dataset="synthetic", num_samples=240, num_test=60, num_classes=3, sample_shape=(6,),
            num_clients=4, partition="iid",
        )  # fmt: skip
        loop.fit(objective(**SYNTHETIC), datamodule=dm, ckpt_path=ckpt_path)
        return loop

    runs = {accelerator: run(accelerator, 3) for accelerator in ("cpu", "cuda")}
    gpu = runs["cuda"].aggregator
    assert set(gpu.devices) == {"cuda"}  # between rounds, from the first round on
    assert {t.device.type for t in _tensors(gpu.state_dict())} == {"cuda"}
    for key, value in runs["cpu"].aggregator.global_state().items():
        torch.testing.assert_close(gpu.global_state()[key].cpu(), value, rtol=1e-4, atol=1e-4)
    checkpoint = read_checkpoint(str(tmp_path / "cuda" / "last.ckpt"))
    assert {t.device.type for t in _tensors(checkpoint)} == {"cpu"}
    saved = torch.load(tmp_path / "cuda" / "global.pt", weights_only=True)
    assert {t.device.type for t in _tensors(saved)} == {"cpu"}
    # resumed on the GPU: the checkpoint's state goes back onto it
    resumed = run("cuda", 4, ckpt_path=str(tmp_path / "cuda" / "last.ckpt"))
    assert set(resumed.aggregator.devices) == {"cuda"}
    assert {t.device.type for t in _tensors(resumed.aggregator.state_dict())} == {"cuda"}

"""User-written client objectives for the reliability tests, named by ``class_path`` in CLI runs
(this folder is on ``sys.path`` under pytest)."""

import os
import signal
import threading
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from fedlightning.clients import ClientModule, FedProx, ScaffoldClient
from fedlightning.protocol import StateDict
from fedlightning.server import FedAvg
from fedlightning.server.functional import owner_average
from fedlightning.server.statistics import Statistic, StatisticContext


class CrashAndNaN:
    """Put in front of any client objective: client 0's fit always raises and client 1 always
    uploads NaN weights; both must be left out without losing the run."""

    def training_step(self, batch, batch_idx):
        if self.client_id == 0:
            raise RuntimeError("simulated crash of client 0")
        return super().training_step(batch, batch_idx)

    def end_client(self, num_steps):
        weights, extras, state = super().end_client(num_steps)
        if self.client_id == 1:
            weights = {
                k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                for k, v in weights.items()
            }
        return weights, extras, state


class CrashAndNaNClients(CrashAndNaN, ScaffoldClient):
    """SCAFFOLD with :class:`CrashAndNaN` (its per-client state shows what a failure leaves)."""


class ScheduledClient(ClientModule):
    """A user objective as Lightning users write them: ``configure_optimizers`` returns the
    optimizer and a scheduler config in the dict form (halve the LR every 4 steps)."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class SmoothedCE(ClientModule):
    """A user objective that only states its loss (label smoothing); it runs heterogeneously
    with ``networks`` and needs no other class."""

    def __init__(self, eps: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.eps = eps

    def local_loss(self, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y, label_smoothing=self.eps)


class BrokenObjective(ClientModule):
    """A bug every client hits: the run must stop with this traceback, not end at chance."""

    def local_loss(self, batch):
        return super().local_loss(batch) * (1 // 0)


class ServerNesterov(FedAvg):
    """A user-written server optimizer on the documented hook, as the README's "adding an
    algorithm" shows: Nesterov momentum on the pseudo-gradient ``d = w - mean``:
    ``v <- beta v + d``, ``w <- w - (beta v + d)`` on the parameters (buffers take the mean)."""

    def __init__(self, beta: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.beta = beta
        self.add_state("velocity", "parameters")

    def server_update(self, server_round):
        new = {}
        for key in server_round.parameter_keys:
            d = self.weights[key] - server_round.mean[key]
            self.velocity[key] = self.beta * self.velocity[key] + d
            new[key] = self.weights[key] - (self.beta * self.velocity[key] + d)
        return new


class NaNServer(FedAvg):
    """An aggregator that writes NaN into the global model every round (its first parameter): the
    run must fail, naming it and the key, never save the NaN model or exit 0."""

    def server_update(self, server_round):
        key = server_round.parameter_keys[0]
        return {key: torch.full_like(server_round.mean[key], float("nan"))}


class WrongShapeUpload(ClientModule):
    """Client 2 uploads its first weight tensor flattened: a wrong shape that must be rejected as
    that client's failure, not crash the aggregation or the evaluation."""

    def end_client(self, num_steps):
        weights, extras, state = super().end_client(num_steps)
        if self.client_id == 2:
            first = next(iter(weights))
            weights = {**weights, first: weights[first].reshape(-1)}
        return weights, extras, state


class FailsClientOne(ClientModule):
    """Client 1's fit always raises (in ``begin_client``); every other client trains."""

    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        if client_id == 1:
            raise ValueError("client 1 is broken")


class FailsEveryOtherRound(ClientModule):
    """Every client fails in rounds 2, 4, ... (8 clients a round, fitted in order), with two kinds
    of error so that it is no "same bug everywhere": those rounds are skipped."""

    fits = 0

    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        round_index = FailsEveryOtherRound.fits // 8
        FailsEveryOtherRound.fits += 1
        if round_index % 2 == 1:
            raise (ValueError if client_id % 2 else KeyError)(f"flaky client {client_id}")


class UserFedDynClient(FedProx):
    """FedDyn's client (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR
    2021, arXiv:2111.04263) as a user writes it on FedProx, with no declaration for the cohort
    backend: ``loss = CE - <g_i, w> + (mu / 2) ||w - w_t||^2``, where the per-client ``g_i`` comes
    from the client's state and is renewed after the fit: ``g_i <- g_i - mu (w_i - w_t)``."""

    def __init__(self, mu: float = 0.1, **kwargs):
        super().__init__(mu=mu, **kwargs)

    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        saved = state.get("g", {})
        self._g = {n: saved[n].to(a) if n in saved else torch.zeros_like(a)
                   for n, a in self._anchor.items()}  # fmt: skip

    def local_loss(self, batch):
        params = dict(self.network.named_parameters())
        linear = torch.stack([(g * params[n]).sum() for n, g in self._g.items()]).sum()
        return super().local_loss(batch) - linear

    def end_client(self, num_steps):
        weights, extras, state = super().end_client(num_steps)
        g = {n: (g - self.mu * (weights[n] - self._anchor[n])).cpu() for n, g in self._g.items()}
        return weights, extras, {**state, "g": g}


class FedDynReadingState(UserFedDynClient):
    """The same objective reading ``g_i`` from ``self.state`` inside ``local_loss``: trains
    sequentially, refused by the cohort backend naming ``state``."""

    def local_loss(self, batch):
        saved = self.state.get("g", {})
        params = dict(self.network.named_parameters())
        linear = sum((saved[n].to(p) * p).sum() for n, p in params.items() if n in saved)
        return FedProx.local_loss(self, batch) - linear


class PerClientSmoothing(ClientModule):
    """``begin_client`` sets a per-client Python float that ``local_loss`` reads (label smoothing
    by client): trains sequentially, refused by the cohort backend naming ``_smoothing``."""

    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        self._smoothing = 0.01 * client_id

    def local_loss(self, batch):
        x, y = batch
        return F.cross_entropy(self(x), y, label_smoothing=self._smoothing)


class MismatchedUpload(ClientModule):
    """Client ``bad_client`` (every client with ``bad_client: -1``) uploads weights that do not
    match the payload: ``upload`` is ``int64`` (every tensor cast to int64), ``float64``,
    ``numpy`` (numpy arrays), ``list`` (nested lists) or ``extra_key`` (a key the payload lacks).
    Each must be that client's rejection naming the key, never averaged in or a traceback."""

    def __init__(self, upload: str = "int64", bad_client: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.upload, self.bad_client = upload, bad_client

    def end_client(self, num_steps):
        weights, extras, state = super().end_client(num_steps)
        if self.bad_client in (-1, self.client_id):
            weights = _mismatched(weights, self.upload)
        return weights, extras, state


def _mismatched(weights, how):
    if how == "extra_key":
        return {**weights, "not_in_the_payload": torch.zeros(3)}
    change = {
        "int64": lambda v: v.to(torch.int64),
        "float64": lambda v: v.to(torch.float64),
        "numpy": lambda v: v.detach().cpu().numpy(),
        "list": lambda v: v.detach().cpu().tolist(),
    }[how]
    return {k: change(v) if v.is_floating_point() else v for k, v in weights.items()}


class MismatchedExtra(ScaffoldClient):
    """SCAFFOLD whose client ``bad_client`` uploads a ``delta_c`` that does not match the payload:
    ``extra`` is ``float64`` (every tensor cast), ``numpy`` (numpy arrays) or ``missing`` (no
    ``delta_c`` at all, which the Scaffold aggregator requires)."""

    def __init__(self, extra: str = "float64", bad_client: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.extra, self.bad_client = extra, bad_client

    def end_client(self, num_steps):
        weights, extras, state = super().end_client(num_steps)
        if self.client_id == self.bad_client:
            if self.extra == "missing":
                extras = {k: v for k, v in extras.items() if k != "delta_c"}
            else:
                extras = {**extras, "delta_c": _mismatched(extras["delta_c"], self.extra)}
        return weights, extras, state


class ManualOptimization(ClientModule):
    """Manual optimization as Lightning users write it (so every fit runs on a Trainer): one SGD
    step per batch with ``manual_backward``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        optimizer.zero_grad()
        loss = self.local_loss(batch)
        self.manual_backward(loss)
        optimizer.step()
        return loss


class SignalMidFit:
    """Put in front of an objective: with ``FEDLIGHTNING_TEST_SIGNAL=NAME:N`` in the environment,
    the N-th client fit of the process sends signal NAME (INT, TERM) to its own process from its
    first training step, as a Ctrl-C or a cluster's SIGTERM lands in the middle of a fit.
    Overriding ``training_step`` makes every fit a Lightning Trainer fit."""

    fits = 0

    def training_step(self, batch, batch_idx):
        wanted = os.environ.get("FEDLIGHTNING_TEST_SIGNAL")
        if wanted and self.trainer.current_epoch == 0 and batch_idx == 0:
            SignalMidFit.fits += 1
            name, at = wanted.split(":")
            if SignalMidFit.fits == int(at):
                os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
        return super().training_step(batch, batch_idx)


class TrainerFitSignalled(SignalMidFit, ClientModule):
    """ClientModule's loss on a Trainer, signalled mid-fit (:class:`SignalMidFit`)."""


class ManualOptimizationSignalled(SignalMidFit, ManualOptimization):
    """:class:`ManualOptimization` signalled mid-fit (:class:`SignalMidFit`)."""


class RaisingAggregator(FedAvg):
    """A plug-in aggregator whose constructor raises (an option read from the environment)."""

    def __init__(self, beta: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        raise ValueError(f"beta={beta} needs SERVER_KEY in the environment")


class RaisingObjective(ClientModule):
    """A plug-in objective whose constructor raises."""

    def __init__(self, eps: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        raise RuntimeError("no label smoothing table for eps=0.1")


class WrongServerUpdate(FedAvg):
    """A server update that returns, from round ``from_round`` on, what the server state cannot
    hold for its first parameter (``how``): ``shape`` (flattened), ``dtype`` (float64),
    ``numpy`` (a numpy array of the right dtype and shape), ``device`` (on the meta device): the
    run must stop naming it and the key, after its last good checkpoint."""

    def __init__(self, how: str = "shape", from_round: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        self.from_round = from_round

    def server_update(self, server_round):
        if server_round.index + 1 < self.from_round:
            return {}
        key = server_round.parameter_keys[0]
        mean = server_round.mean[key]
        wrong = {"shape": lambda: mean.flatten(), "dtype": mean.double,
                 "numpy": lambda: mean.cpu().numpy(), "device": lambda: mean.to("meta")}  # fmt: skip
        return {key: wrong[self.how]()}


class UnpicklableState(FedAvg):
    """An aggregator whose declared state comes to hold a lock, which no checkpoint can hold:
    the run must stop naming it and the key before its first checkpoint."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("guard", [])

    def server_update(self, server_round):
        self.guard.append(threading.Lock())
        return super().server_update(server_round)


# -- the state contract (docs/algorithms.md section 2.6): plug-ins as users write them -----------
class AdamPlainCounter(FedAvg):
    """Adam on the server with bias correction (Kingma and Ba, arXiv:1412.6980) on the
    pseudo-gradient ``d = w - mean``, its step counter a plain attribute: ``self.t`` is not
    declared, so the run is refused at the round that changes it."""

    def __init__(self, lr: float = 0.05, beta1: float = 0.9, beta2: float = 0.99, **kwargs):
        super().__init__(**kwargs)
        self.lr, self.beta1, self.beta2 = lr, beta1, beta2
        self.t = 0
        self.add_state("m", "parameters")
        self.add_state("v", "parameters")

    def server_update(self, server_round):
        self.t += 1
        new = {}
        for key in server_round.parameter_keys:
            d = self.weights[key] - server_round.mean[key]
            self.m[key] = self.beta1 * self.m[key] + (1 - self.beta1) * d
            self.v[key] = self.beta2 * self.v[key] + (1 - self.beta2) * d * d
            m_hat = self.m[key] / (1 - self.beta1**self.t)
            v_hat = self.v[key] / (1 - self.beta2**self.t)
            new[key] = self.weights[key] - self.lr * m_hat / (v_hat.sqrt() + 1e-3)
        return new


class AdamDeclaredCounter(AdamPlainCounter):
    """The same with its counter declared (``add_state("t", 0)``): checkpointed, resumed and
    restored with the rest of the state."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("t", 0)


class _MemoryObjective(ClientModule):
    """A per-client linear term ``<m_i, w>`` in the loss, with ``m_i <- m_i + mu (w_i - w_t)``
    after each fit (a FedDyn-like memory of the client's past updates)."""

    def __init__(self, mu: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.mu = mu

    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        saved = self.saved_memory(client_id, state)
        self._m = {n: saved[n].to(p) if n in saved else torch.zeros_like(p)
                   for n, p in self.network.named_parameters()}  # fmt: skip
        self._start = {n: p.detach().clone() for n, p in self.network.named_parameters()}

    def local_loss(self, batch):
        params = dict(self.network.named_parameters())
        linear = torch.stack([(m * params[n]).sum() for n, m in self._m.items()]).sum()
        return super().local_loss(batch) + linear

    def new_memory(self, weights):
        return {n: (m + self.mu * (weights[n] - self._start[n])).cpu() for n, m in self._m.items()}


class MemoryOnModule(_MemoryObjective):
    """Keeps ``m_i`` on the module (``self.memory[client_id]``): refused on every backend."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.memory = {}

    def saved_memory(self, client_id, state):
        return self.memory.get(client_id, {})

    def end_client(self, num_steps):
        weights, extras, state = super().end_client(num_steps)
        self.memory[self.client_id] = self.new_memory(weights)
        return weights, extras, state


class MemoryInState(_MemoryObjective):
    """Keeps ``m_i`` in the state ``end_client`` returns: resumed exactly, the same under the
    cohort."""

    def saved_memory(self, client_id, state):
        return state.get("m", {})

    def end_client(self, num_steps):
        weights, extras, state = super().end_client(num_steps)
        return weights, extras, {**state, "m": self.new_memory(weights)}


class FedDynServer(FedAvg):
    """FedDyn's server (Acar et al., ICLR 2021, arXiv:2111.04263): ``h <- h - alpha (mean - w)``,
    ``w <- mean - h / alpha`` on the parameters."""

    def __init__(self, alpha: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.alpha = alpha
        self.add_state("h", "parameters")

    def server_update(self, server_round):
        new = {}
        for key in server_round.parameter_keys:
            self.h[key] = self.h[key] - self.alpha * (server_round.mean[key] - self.weights[key])
            new[key] = server_round.mean[key] - self.h[key] / self.alpha
        return new


class FedDynPaired(UserFedDynClient):
    """FedDyn's client naming the server it needs."""

    required_aggregator = frozenset({"FedDynServer"})


# -- extension contracts that fail in one line (issue 43 item 5) ---------------------------------
class WrongStatistic(Statistic):
    """A statistic returning the owner-aware mean with, for its first floating key, what the
    server cannot take (``how``): ``numpy`` (a numpy array), ``missing`` (the key left out: that
    layer would never train), ``shape`` (flattened), ``extra`` (a key the model does not have)."""

    def __init__(self, how: str = "numpy") -> None:
        self.how = how

    def combine(
        self, uploads: Sequence[StateDict], weights: Sequence[float], context: StatisticContext
    ) -> StateDict:
        mean = owner_average(context.model, uploads, weights)
        key = next(k for k, v in mean.items() if v.is_floating_point())
        if self.how == "missing":
            del mean[key]
        elif self.how == "extra":
            mean["extra.weight"] = mean[key]
        else:
            mean[key] = mean[key].cpu().numpy() if self.how == "numpy" else mean[key].flatten()
        return mean


class RaisesInLoss(ClientModule):
    """An objective whose loss raises (a bug in the plug-in): every client's fit fails."""

    def local_loss(self, batch):
        raise ValueError("no class weights for this batch")


class HoldsALock(ClientModule):
    """An objective holding a lock in a dict attribute, which cannot be pickled to Ray's
    workers."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.cache = {"guard": threading.Lock()}

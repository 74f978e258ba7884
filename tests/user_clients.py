"""User-written client objectives for the reliability tests, named by ``class_path`` in CLI runs
(this folder is on ``sys.path`` under pytest)."""

import os
import signal

import torch

from fedlightning.clients import ClientModule, ScaffoldClient
from fedlightning.server import FedAvg


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
    """A user-written server optimizer, as the README's "adding an algorithm" shows: Nesterov
    momentum on the pseudo-gradient ``d = w - mean``: ``v <- beta v + d``, ``w <- w - (beta v + d)``."""

    def __init__(self, beta: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.beta, self.velocity = beta, {}

    def server_step(self, round_index, averaged):
        new = dict(averaged)
        for key, mean in averaged.items():
            if mean.is_floating_point() and not key.endswith(("running_mean", "running_var")):
                d = self.weights[key] - mean
                v = self.beta * self.velocity.get(key, torch.zeros_like(d)) + d
                self.velocity[key] = v
                new[key] = self.weights[key] - (self.beta * v + d)
        return new

    def state_dict(self):
        return {**super().state_dict(), "velocity": self.velocity}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.velocity = {k: v.clone() for k, v in state["velocity"].items()}


class WrongShapeUpload(ClientModule):
    """Client 2 uploads its first weight tensor flattened: a wrong shape that must be rejected as
    that client's failure, not crash the aggregation or the evaluation."""

    def end_client(self, num_steps):
        weights, extras, state = super().end_client(num_steps)
        if self.client_id == 2:
            first = next(iter(weights))
            weights = {**weights, first: weights[first].reshape(-1)}
        return weights, extras, state


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

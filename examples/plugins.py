"""The README's "Adding an algorithm" example: a client objective and an aggregator of your own.

Run it from the repository root (``PYTHONPATH=.`` makes ``examples.plugins`` importable):

    PYTHONPATH=. fedlightning fit -c configs/quickstart.yaml --loop.rounds 5 \\
        --model.class_path examples.plugins.LabelSmoothing --model.init_args.eps 0.1 \\
        --loop.aggregator examples.plugins.ServerMomentum --loop.aggregator.beta 0.5
"""

import torch.nn.functional as F

from fedlightning.clients import ClientModule
from fedlightning.server import FedAvg


class LabelSmoothing(ClientModule):
    """loss = CE with label smoothing eps: only the local loss changes."""

    def __init__(self, eps: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.eps = eps

    def local_loss(self, batch):
        x, y = batch
        return F.cross_entropy(self(x), y, label_smoothing=self.eps)


class ServerMomentum(FedAvg):
    """v <- beta * v + (w - mean);  w <- w - v  (server momentum on the averaged update)."""

    def __init__(self, beta: float = 0.9, **kwargs):
        super().__init__(**kwargs)
        self.beta, self.velocity = beta, {}

    def server_step(self, round_index, averaged):
        new = dict(averaged)
        for key, mean in averaged.items():
            if mean.is_floating_point():
                step = self.weights[key] - mean
                self.velocity[key] = self.beta * self.velocity.get(key, 0) + step
                new[key] = self.weights[key] - self.velocity[key]
        return new

    def state_dict(self):
        return {**super().state_dict(), "velocity": self.velocity}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.velocity = dict(state["velocity"])

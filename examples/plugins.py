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
    """Server momentum on the mean of the uploads: d = w - mean, v <- beta * v + d, w <- w - v."""

    def __init__(self, beta: float = 0.9, **kwargs):
        super().__init__(**kwargs)
        self.beta = beta
        self.add_state("velocity", "parameters")  # zeros like each trainable parameter

    def server_update(self, server_round):
        new = {}
        for key in server_round.parameter_keys:  # buffers (BatchNorm statistics) take the mean
            d = self.weights[key] - server_round.mean[key]
            self.velocity[key] = self.beta * self.velocity[key] + d
            new[key] = self.weights[key] - self.velocity[key]
        return new

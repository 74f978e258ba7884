"""User-written client objectives for the reliability tests, named by ``class_path`` in CLI runs
(this folder is on ``sys.path`` under pytest)."""

import torch

from fedlightning.clients import ScaffoldClient


class CrashAndNaN:
    """Put in front of any client objective: client 0's fit always raises and client 1 always
    uploads NaN weights; both must be left out without losing the run."""

    def training_step(self, batch, batch_idx):
        if self.client_id == 0:
            raise RuntimeError("simulated crash of client 0")
        return super().training_step(batch, batch_idx)

    def end_client(self):
        weights, extras, state = super().end_client()
        if self.client_id == 1:
            weights = {
                k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                for k, v in weights.items()
            }
        return weights, extras, state


class CrashAndNaNClients(CrashAndNaN, ScaffoldClient):
    """SCAFFOLD with :class:`CrashAndNaN` (its per-client state shows what a failure leaves)."""

"""What a client objective tells the scoring path (docs/algorithms.md section 6.1).

Evaluation never runs the objective: it scores each deployable through a network the scoring path
owns, copied once per run from the objective's client groups, in eval mode and without gradients
(:mod:`fedlightning.loop.scoring_model`). These hooks are all an objective says about it:

- :meth:`~EvaluationHooks.scoring_network`: the module to score around a copy of one of its
  architectures (default: the copy itself; FML with adaptor heads adds the assembled head);
- :meth:`~EvaluationHooks.scoring_state`: that module's state for a deployable's weights
  (default: the weights);
- :meth:`~EvaluationHooks.prepare_evaluation`: called with every client's state before an
  evaluation (FML assembles its clients' heads);
- :meth:`~EvaluationHooks.evaluate_clients`: extra metrics over the clients (FML's personal
  models), scored through networks of the scoring path (:class:`~fedlightning.scoring.
  ScoringNetworks`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from fedlightning.protocol import StateDict

if TYPE_CHECKING:
    from fedlightning.scoring import ScoringNetworks
    from fedlightning.state import ClientStore


class EvaluationHooks:
    """The scoring hooks of :class:`~fedlightning.clients.ClientModule` (module docstring)."""

    def scoring_network(self, network: nn.Module) -> nn.Module:
        """The module evaluation scores for a deployable of ``network``'s architecture, built
        around ``network`` (a copy owned by the scoring path, never trained). The default is
        ``network`` itself: an objective whose ``forward`` is not its network's must override this
        (start-up refuses it otherwise)."""
        return network

    def scoring_state(self, weights: StateDict) -> StateDict:
        """The state of :meth:`scoring_network`'s module for a deployable's ``weights`` (called
        after :meth:`prepare_evaluation`); the default is ``weights``."""
        return weights

    def prepare_evaluation(self, store: ClientStore) -> None:
        """Called at the start of every evaluation, before the deployable models are scored, with
        every client's persistent state (FML assembles its clients' adaptor heads). The default
        does nothing."""

    def evaluate_clients(
        self,
        client_ids: Sequence[int],
        store: ClientStore,
        val_dataloader: Callable[[int], Iterable[tuple[Tensor, Tensor]]],
        device: torch.device,
        *,
        scoring: ScoringNetworks | None = None,
    ) -> dict[str, float]:
        """Extra metrics over the round's participating clients, called by the loop after its
        standard evaluation (e.g. FML's personal models on their own validation splits).

        Args:
            client_ids: the clients whose upload was aggregated this round.
            store: the ClientStore holding every client's persistent state.
            val_dataloader: ``val_dataloader(client_id)`` gives that client's validation batches.
            device: where the loop evaluates.
            scoring: the run's scoring networks, with this evaluation's deployables: score through
                networks built by :meth:`~fedlightning.scoring.ScoringNetworks.load` (in eval
                mode, no gradients, off the objective's own modules). The loop passes it when an
                override declares it; ``None`` (a direct call): build your own.
        """
        return {}

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
- :meth:`~EvaluationHooks.evaluate_clients`: extra metrics over the clients (FML's adaptor
  heads), scored through networks of the scoring path (:class:`~fedlightning.scoring.
  ScoringNetworks`).

Personalized evaluation (docs/algorithms.md section 10): every client scores the model it would
deploy on its own held-out split. An objective says what that model is, and the loop scores it
(:mod:`fedlightning.loop.personal`):

- :attr:`~EvaluationHooks.personalized`: the objective's clients deploy models of their own, so the
  loop scores them by default;
- :meth:`~EvaluationHooks.personal_state`: client i's deployed weights, from the server's
  deployable and the client's persistent state (default: the deployable itself, as a global
  method deploys the global model);
- :meth:`~EvaluationHooks.personal_network`: the network those weights are loaded into when it is
  not the deployable's architecture (FML's personal model; default: none);
- :meth:`~EvaluationHooks.personal_defaults`: the objective's own personalization step, as options
  of ``loop.personal`` (FedBABU's fine-tuning; default: none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from fedlightning.protocol import StateDict

if TYPE_CHECKING:
    from fedlightning.scoring import ScoringNetworks
    from fedlightning.state import ClientStore


class PersonalNetwork(NamedTuple):
    """A client's deployed network when it is not the deployable's architecture: ``name`` (the
    registered model name, saved with the model in ``personal.pt``; it also keys the scoring
    network, one per name) and ``build`` (builds an untrained one; evaluation loads the client's
    weights into it)."""

    name: str
    build: Callable[[], nn.Module]


class EvaluationHooks:
    """The scoring hooks of :class:`~fedlightning.clients.ClientModule` (module docstring)."""

    #: each client deploys a model of its own (personalized FL): the loop scores every client's
    #: deployed model on its own split unless ``loop.personal`` says otherwise
    personalized: ClassVar[bool] = False

    def personal_state(
        self, client_id: int, state: Mapping[str, Any], deployed: StateDict
    ) -> StateDict | None:
        """The weights client ``client_id`` would deploy now, from ``deployed`` (the server's
        deployable of the client's architecture: what it would download) and its persistent
        ``state`` (``{}`` before its first fit; read, never modified). ``None``: the client has
        no model to deploy yet, and is not scored. The default is ``deployed`` (a global method's
        client deploys the global model; ``loop.personal``'s fine-tuning then personalizes it).
        The weights are loaded into :meth:`personal_network`'s module, or else into the
        deployable's scoring network through :meth:`scoring_state`."""
        return deployed

    def personal_defaults(self) -> dict[str, Any]:
        """The options of :class:`~fedlightning.loop.personal_options.PersonalEvaluation` the
        objective's own personalization step needs when ``loop.personal`` is null (FedBABU's
        fine-tuning epochs); default: none."""
        return {}

    def personal_network(self, client_id: int) -> PersonalNetwork | None:
        """The network client ``client_id``'s :meth:`personal_state` is loaded into when it is not
        the deployable's architecture (default ``None``: it is)."""
        return None

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

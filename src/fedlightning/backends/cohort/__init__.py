"""The cohort backend (:class:`CohortBackend`): a round's sampled clients fitted at once, one
``torch.func.vmap`` over their stacked parameters (docs/algorithms.md section 5). Its modules, by
concept:

- the backend: :mod:`.backend` (the fit contract), :mod:`.plan` (a round's clients in chunks of
  equal step counts);
- stacking, each client's view of the stacked state: :mod:`.state` (parameters, buffers, the
  objective's per-client attributes), :mod:`.context` (which of an objective's modules and
  attributes are per client);
- stepping: :mod:`.step` (one vmapped training step), :mod:`.optim` (the stacked optimizer, its
  scaler and gradient clipping), :mod:`.metrics` (per-client logged metrics), :mod:`.capture`
  (the whole step compiled);
- checks: :mod:`.checks` (what the cohort refuses, in one line, before a round), :mod:`.failure`
  (a client's failure inside the stacked fit, named);
- memory: :mod:`.memory` (chunk sizes that fit the device).
"""

from fedlightning.backends.cohort.backend import CohortBackend

__all__ = ["CohortBackend"]

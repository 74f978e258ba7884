"""Backends run a round's client fits (:class:`Backend`): ``SequentialBackend`` (one after the
other), ``CohortBackend`` (all sampled clients at once with ``torch.func.vmap``) and
``RayBackend`` (long-lived Ray actors; the ``ray`` extra), ``FlowerBackend`` (SuperNodes of a
Flower deployment; the ``flower`` extra); ``AutoBackend`` (the loop's default)
chooses by a rule per device kind: sequential fits on a CPU, the cohort on an accelerator where it
is supported (docs/algorithms.md section 9.3). Chosen by ``loop.backend`` with a
``class_path`` like the aggregator; results do not depend on the backend beyond the cohort's
floating-point reassociation (see :mod:`fedlightning.backends.base` for where that shows)."""

from fedlightning.lazy import lazy_exports

#: public name -> its module, imported on first use (fedlightning.lazy: no Lightning before)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".auto": "AutoBackend", ".base": "Backend", ".cohort": "CohortBackend",
    ".flower": "FlowerBackend", ".ray": "RayBackend", ".sequential": "SequentialBackend",
})  # fmt: skip

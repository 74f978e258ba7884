"""Garbage-collector settings that shorten start-up and exit (``benchmarks/startup.py`` measures them).

Importing fedlightning imports Lightning, which imports torchmetrics, torchvision, torch._dynamo,
sympy, scipy and matplotlib: about 450,000 objects the cyclic garbage collector tracks. While they
are created, CPython's collector runs again and again over the growing heap (about 1,000 young
and 7 full collections, about 20% of the import's CPU time on this project's machine), although
an import leaves almost no cyclic garbage. And a process that ends runs one more full collection
over all of them before it exits.

- :func:`gc_paused` pauses the collector while ``import fedlightning`` runs and puts the imported
  objects in the oldest generation (it is re-enabled after, if it was enabled before: the process
  collects as usual from then on).
- :func:`freeze_imported` (the ``fedlightning`` command calls it once its imports are done) moves
  the objects that exist then (modules, classes, functions: they live as long as the process) to
  the collector's permanent generation (:func:`gc.freeze`), so no later collection, nor the one
  at exit, walks them again. Objects made later are collected as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block (restored to its previous state), then
    put what the block made straight into the oldest generation (:func:`gc.freeze` and
    :func:`gc.unfreeze`), where young collections do not walk it again: without that, the first
    young collection after the block walks every object it made (about 0.25 s after Lightning's
    imports). Skipped when objects are frozen already (the caller's own, left as they are)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if enabled:
            gc.enable()


def freeze_imported() -> None:
    """Exclude every object tracked now from later collections (:func:`gc.freeze`)."""
    gc.freeze()

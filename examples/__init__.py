"""Examples that the README runs (``PYTHONPATH=. fedlightning fit ... examples.plugins...``).

A regular package, so that ``examples.plugins`` resolves to this folder even where an installed
distribution ships a top-level ``examples`` package (opacus 1.6 does): a folder without
``__init__.py`` is a namespace package, which any regular package of that name on ``sys.path``
shadows, whatever the order."""

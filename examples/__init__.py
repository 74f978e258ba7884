"""Examples run from the repository root (``PYTHONPATH=.``). A regular package, not a namespace
one: Opacus 1.6's wheel (the ``privacy`` extra) installs a top-level ``examples`` package of its
own, and a regular package anywhere on ``sys.path`` wins over a namespace package."""

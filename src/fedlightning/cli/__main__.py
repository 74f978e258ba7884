"""``python -m fedlightning.cli``: the ``fedlightning`` command."""

from fedlightning.cli import main

main()

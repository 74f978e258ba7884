"""``python -m fedlightning.flower_app --config CONFIG --out DIR``: write a Flower App."""

from fedlightning.flower_app.export import main

main()

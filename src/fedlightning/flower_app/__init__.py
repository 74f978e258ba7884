"""Flower (``flwr``) apps for fedlightning: the ClientApp SuperNodes run (:mod:`.client`), the wire
format (:mod:`.records`), the Grid transport (:mod:`.transport`), the relay ServerApp the
FlowerBackend starts (:mod:`.relay`), the exported app's ServerApp (:mod:`.server`) and the
``fedlightning flower-app`` exporter (:mod:`.export`). Needs ``pip install 'fedlightning[flower]'``.
"""

"""Flower (``flwr``) apps for fedlightning: the ClientApp SuperNodes run (:mod:`.warm_client`,
forwarding to the node's warm worker, :mod:`.worker`, which runs :mod:`.client`'s fits), the wire
format (:mod:`.records`), the Grid transport (:mod:`.transport`), the relay ServerApp the
FlowerBackend starts (:mod:`.relay`, submitted by :mod:`.connect`), the exported app's ServerApp
(:mod:`.server`), the ``fedlightning flower-app`` exporter (:mod:`.export`) and, for tests and
benchmarks, a federation on 127.0.0.1 (:mod:`.local`, with throwaway TLS and node keys from
:mod:`.credentials`). Needs ``pip install 'fedlightning[flower]'``.
"""

"""Asynchronous federated learning on the virtual clock (docs/algorithms.md section 6.4): an
:class:`AsyncServer` in ``loop.components`` turns the run's rounds into server updates driven by
client arrivals (:class:`FedBuff`, :class:`FedAsync`)."""

from fedlightning.asynchronous.fedasync import FedAsync, staleness_factor
from fedlightning.asynchronous.fedbuff import FedBuff
from fedlightning.asynchronous.server import AsyncServer

__all__ = ["AsyncServer", "FedAsync", "FedBuff", "staleness_factor"]

"""Time as a dimension (docs/algorithms.md section 6.3): each client's system profile (speed,
link, availability, dropouts) and the run's virtual clock, as the round component
:class:`SystemModel` (``loop.components``)."""

from fedlightning.system.distributions import Constant, Distribution, Exponential, LogNormal, Pareto
from fedlightning.system.model import SystemModel
from fedlightning.system.profiles import ClientProfiles, read_trace

__all__ = [
    "ClientProfiles", "Constant", "Distribution", "Exponential", "LogNormal", "Pareto",
    "SystemModel", "read_trace",
]  # fmt: skip

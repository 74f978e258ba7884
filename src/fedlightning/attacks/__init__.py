"""Byzantine attacks: malicious clients for robustness experiments (``loop.attack``;
docs/algorithms.md section 8.1, :mod:`fedlightning.attacks.base`)."""

from fedlightning.attacks.alie import ALIE
from fedlightning.attacks.base import Attack
from fedlightning.attacks.ipm import InnerProductManipulation
from fedlightning.attacks.labels import LabelFlip
from fedlightning.attacks.mimic import Mimic
from fedlightning.attacks.upload import BitFlip, GaussianNoise, Scaling, SignFlip

__all__ = [
    "ALIE", "Attack", "BitFlip", "GaussianNoise", "InnerProductManipulation", "LabelFlip",
    "Mimic", "Scaling", "SignFlip",
]  # fmt: skip

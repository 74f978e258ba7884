"""Attacks that replace each malicious upload on its own: sign flipping, bit flipping, scaling
(model replacement), Gaussian noise (docs/algorithms.md section 8.1)."""

from __future__ import annotations

import torch

from fedlightning.attacks.base import PREFIX, AttackRound, UploadAttack
from fedlightning.attacks.maths import gaussian_upload, rescale_update
from fedlightning.errors import require
from fedlightning.protocol import StateDict, Upload
from fedlightning.seeding import derive_seed


class SignFlip(UploadAttack):
    """Sign flipping: the malicious update ``u_i = w_i - w`` is replaced by ``-s u_i``, i.e. the
    upload becomes ``w - s (w_i - w)``. With updates that agree, a uniform mean over a malicious
    fraction ``f`` moves by ``(1 - f (1 + s)) u``: the default ``s = 4`` cancels the honest
    progress at ``f = 1/(1 + s) = 20%`` and reverses it beyond.

    Args:
        fraction, clients: the malicious clients (:class:`~fedlightning.attacks.base.Attack`).
        scale: s > 0.
    """

    def __init__(
        self, fraction: float = 0.0, clients: list[int] | None = None, scale: float = 4.0
    ) -> None:
        super().__init__(fraction, clients)
        require(scale > 0, f"{PREFIX}.scale", scale, "a number > 0")
        self.scale = scale

    def corrupt_upload(
        self, attack_round: AttackRound, upload: Upload, ref: StateDict
    ) -> StateDict:
        return rescale_update(upload.weights, ref, -self.scale)


class BitFlip(UploadAttack):
    """Bit flipping (Karimireddy, He, Jaggi, ICLR 2022, arXiv:2006.09365, section 5; the
    reference code's ``BitFlippingWorker``): the malicious client sends the negation of what it
    computed honestly, its gradient ``-g_i`` there, here its update: ``u_i -> -u_i``, the upload
    ``w - (w_i - w)``. :class:`SignFlip` with ``scale = 1``. Clients that upload a momentum
    (:class:`~fedlightning.clients.WorkerMomentum`) flip their momentum.

    Args:
        fraction, clients: the malicious clients (:class:`~fedlightning.attacks.base.Attack`).
    """

    def __init__(self, fraction: float = 0.0, clients: list[int] | None = None) -> None:
        super().__init__(fraction, clients)

    def corrupt_upload(
        self, attack_round: AttackRound, upload: Upload, ref: StateDict
    ) -> StateDict:
        return rescale_update(upload.weights, ref, -1.0)


class Scaling(UploadAttack):
    """Scaling (model replacement, Bagdasaryan et al., AISTATS 2020, arXiv:1807.00459): the
    malicious update is boosted to ``gamma u_i``, the upload ``w + gamma (w_i - w)``, so that one
    client outweighs the mean; ``gamma = K`` (the clients per round) replaces the uniform mean by
    the malicious model.

    Args:
        fraction, clients: the malicious clients (:class:`~fedlightning.attacks.base.Attack`).
        factor: gamma > 0.
    """

    def __init__(
        self, fraction: float = 0.0, clients: list[int] | None = None, factor: float = 10.0
    ) -> None:
        super().__init__(fraction, clients)
        require(factor > 0, f"{PREFIX}.factor", factor, "a number > 0")
        self.factor = factor

    def corrupt_upload(
        self, attack_round: AttackRound, upload: Upload, ref: StateDict
    ) -> StateDict:
        return rescale_update(upload.weights, ref, self.factor)


class GaussianNoise(UploadAttack):
    """Gaussian noise: the malicious upload is replaced by ``w + N(0, sigma^2 I)`` around the
    weights the client received, drawn from ``(seed, round, client)``
    (:func:`~fedlightning.attacks.maths.gaussian_upload`).

    Args:
        fraction, clients: the malicious clients (:class:`~fedlightning.attacks.base.Attack`).
        sigma: the noise's standard deviation, > 0.
    """

    def __init__(
        self, fraction: float = 0.0, clients: list[int] | None = None, sigma: float = 1.0
    ) -> None:
        super().__init__(fraction, clients)
        require(sigma > 0, f"{PREFIX}.sigma", sigma, "a number > 0")
        self.sigma = sigma

    def corrupt_upload(
        self, attack_round: AttackRound, upload: Upload, ref: StateDict
    ) -> StateDict:
        seed = derive_seed(attack_round.seed, "attack", attack_round.index, upload.client_id)
        generator = torch.Generator().manual_seed(seed)
        return gaussian_upload(upload.weights, ref, self.sigma, generator)

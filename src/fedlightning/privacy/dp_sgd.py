"""Sample-level differential privacy for every client fit: DP-SGD (Abadi et al., "Deep Learning
with Differential Privacy", CCS 2016, arXiv:1607.00133) as Opacus runs it, for any objective's
``local_loss``. docs/algorithms.md section 7.2.

:class:`DPSGD` is the loop's ``dp_sgd`` option; :func:`check_dp_sgd` refuses at start-up what
per-sample gradients cannot train; :class:`~fedlightning.privacy.dp_sgd_fit.DPSGDFit` runs one
client's fit.
"""

from __future__ import annotations

from typing import Any, Literal

from torch import nn

from fedlightning.compute import canonical
from fedlightning.errors import ConfigurationError, require
from fedlightning.privacy import bounds
from fedlightning.privacy.accountant import DEFAULT, MECHANISMS
from fedlightning.privacy.opacus_extra import require_accountant, require_opacus
from fedlightning.protocol import FitConfig
from fedlightning.recorded_args import RecordsInitArgs

OPTION = "loop.dp_sgd.init_args."
#: where a client's DP-SGD accountant lives in its persistent state (the ClientStore)
STATE_KEY = "dp_sgd_accountant"
#: the upload metric holding the client's epsilon after the fit
EPSILON_METRIC = "dp_sgd_epsilon"
#: layers whose training forward mixes the samples of a batch (no per-sample gradient exists)
BATCH_COUPLED = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
INSTANCE_NORMS = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)


class DPSGD(RecordsInitArgs):
    """DP-SGD in every client fit (docs/algorithms.md section 7.2): each step draws a Poisson
    batch (every sample of the client independently with probability ``q = 1 / ceil(n_i / B)``,
    ``B = data.batch_size``: Opacus's ``DPDataLoader`` rate), computes each sample's gradient of
    the objective's own ``local_loss`` on that sample alone, clips it to L2 norm
    ``max_grad_norm``, sums, adds ``N(0, (noise_multiplier max_grad_norm)^2 I)`` and divides by the
    expected batch size ``q n_i`` (Opacus's ``DPOptimizer``) before the configured optimizer
    steps. An epoch is ``ceil(n_i / B)`` such steps.

    Each client's privacy is composed over all its steps in all the rounds it trained, by its own
    accountant (docs/algorithms.md section 7.3) kept in its ClientStore state; the loop reports
    the max and the mean of the clients' epsilons at ``delta`` (``dp_sgd_epsilon_max``,
    ``dp_sgd_epsilon_mean``; a client that never trained spent 0).

    Args:
        noise_multiplier: sigma in [0.3, 1e6], the noise std relative to ``max_grad_norm``.
        max_grad_norm: C in [1e-9, 1e9], the L2 norm each per-sample gradient is clipped to.
        delta: delta in (0, 1 / the run's training samples) (checked at start-up).
        accountant: ``pld`` (dp-accounting's PLD, the tightest: default), ``prv`` or ``rdp``
            (Opacus's PRVAccountant or RDPAccountant).
    """

    def __init__(
        self,
        noise_multiplier: float = 1.0,
        max_grad_norm: float = 1.0,
        delta: float = 1e-5,
        accountant: Literal["pld", "prv", "rdp"] = DEFAULT,
    ) -> None:
        require_opacus("loop.dp_sgd (DP-SGD clients)")
        bounds.require_noise_multiplier(OPTION + "noise_multiplier", noise_multiplier)
        bounds.require_clip_norm(OPTION + "max_grad_norm", max_grad_norm)
        require(0 < delta < 1, OPTION + "delta", delta, "a number in (0, 1)")
        require(accountant in MECHANISMS, OPTION + "accountant", accountant,
                " or ".join(map(repr, MECHANISMS)))  # fmt: skip
        require_accountant(accountant, f"{OPTION}accountant={accountant!r}")
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = float(max_grad_norm)
        self.delta = float(delta)
        self.accountant = accountant

    def settings(self) -> dict[str, Any]:
        """The options as plain data, as they travel in :class:`~fedlightning.protocol.FitConfig`
        (to Ray actors and Flower nodes)."""
        return {
            "noise_multiplier": self.noise_multiplier, "max_grad_norm": self.max_grad_norm,
            "delta": self.delta, "accountant": self.accountant,
        }  # fmt: skip


def fit_plan(batches_per_epoch: int, config: FitConfig) -> tuple[float, int]:
    """``(q, steps)`` of one DP-SGD fit over ``batches_per_epoch`` batches an epoch
    (``ceil(n_i / B)``): Opacus's ``DPDataLoader`` rate ``q = 1 / batches_per_epoch`` and
    ``local_steps``, or ``local_epochs`` epochs of ``batches_per_epoch`` steps
    (docs/algorithms.md section 7.2)."""
    per_epoch = max(batches_per_epoch, 1)
    return 1.0 / per_epoch, config.local_steps or config.local_epochs * per_epoch


def check_dp_sgd(model: nn.Module, config: FitConfig, trainer_reason: str | None) -> None:
    """Raise a ConfigurationError naming the option when the run cannot train with DP-SGD: a
    precision other than ``32-true``, an objective that needs a Lightning Trainer
    (``trainer_reason``: manual optimization, overridden training hooks) or ``fit_with:
    trainer``, ``gradient_clip_val`` (DP-SGD clips per sample), or a layer that couples the
    samples of a batch (BatchNorm) or updates running statistics in training (InstanceNorm with
    ``track_running_stats``)."""
    if canonical(config.precision) != "32-true":
        raise ConfigurationError(
            f"loop.precision={config.precision!r} is not allowed with loop.dp_sgd: expected "
            "'32-true' (per-sample gradients and their noise in float32)"
        )
    if config.fit_with == "trainer" or trainer_reason is not None:
        why = "loop.fit_with='trainer'" if trainer_reason is None else trainer_reason
        raise ConfigurationError(
            f"loop.dp_sgd trains with per-sample gradients of local_loss, which a Lightning "
            f"Trainer fit does not compute, and this run needs one ({why}): use automatic "
            "optimization without overridden training hooks and loop.fit_with: auto"
        )
    if config.gradient_clip_val is not None:
        raise ConfigurationError(
            f"loop.gradient_clip_val={config.gradient_clip_val} is not allowed with loop.dp_sgd: "
            "expected null (DP-SGD clips each sample's gradient: loop.dp_sgd.init_args."
            "max_grad_norm)"
        )
    for name, module in model.named_modules():
        coupled = isinstance(module, BATCH_COUPLED)
        if coupled or (isinstance(module, INSTANCE_NORMS) and module.track_running_stats):
            why = "normalises each sample by its batch" if coupled else "tracks running statistics"
            raise ConfigurationError(
                f"loop.dp_sgd cannot train this model: its layer {name!r} "
                f"({type(module).__name__}) {why}, so a sample has no gradient of its own: use a "
                "network without BatchNorm (e.g. cnn, mlp, vgg16 with batch_norm: false) or "
                "replace each BatchNorm by GroupNorm (opacus.validators.ModuleValidator.fix does "
                "it) and pass that network as model.init_args.network"
            )

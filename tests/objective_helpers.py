"""Shared by the client-objective tests: a tiny synthetic federation run through the loop."""

from fedlightning import FederatedDataModule, FederatedLoop

#: a small MLP on 6 features and 3 classes (the synthetic source's flat samples)
SYNTHETIC = dict(network="mlp", num_classes=3, in_channels=6, image_size=1, lr=0.1)


def synthetic_run(model, aggregator=None, rounds=2, tmp_path=None, **loop_kwargs):
    """``rounds`` rounds of 2 of 4 synthetic clients; returns the loop after fitting."""
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=240, num_test=60, num_classes=3, sample_shape=(6,), num_clients=4,
        partition="iid",
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=rounds, clients_per_round=2, aggregator=aggregator, run_dir=str(tmp_path), progress_bar=False,
        **loop_kwargs,
    )  # fmt: skip
    loop.fit(model, datamodule=dm)
    return loop

"""A federation with planted clusters, for the clustered-FL tests: two tasks on one input
distribution, the second client half seeing every label shifted by one (y -> (y + 1) mod C), in
its fits and in IFCA's cluster choice alike (both read ``client_train_dataloader``)."""

from fedlightning import FederatedDataModule
from fedlightning.data.loader import TensorBatches

#: the synthetic source's flat samples, a small MLP
NET = dict(network="mlp", num_classes=3, in_channels=6, image_size=1, lr=0.1)


class ShiftedLabels(FederatedDataModule):
    """:class:`FederatedDataModule` whose clients ``shifted`` train on labels ``(y + 1) mod C``."""

    def __init__(self, shifted, **kwargs):
        super().__init__(**kwargs)
        self.shifted = frozenset(shifted)

    def client_train_dataloader(self, client_id, seed):
        batches = super().client_train_dataloader(client_id, seed)
        if client_id not in self.shifted:
            return batches
        labels = (batches.y + 1) % self.num_classes
        return TensorBatches(batches.x, labels, batches.batch_size, shuffle=True, seed=seed)


def planted(num_clients=8, seed=0):
    """``num_clients`` iid clients on 3 classes, the second half with shifted labels."""
    return ShiftedLabels(
        range(num_clients // 2, num_clients), dataset="synthetic", num_samples=480, num_test=60,
        num_classes=3, sample_shape=(6,), num_clients=num_clients, partition="iid", batch_size=32,
        seed=seed,
    )  # fmt: skip

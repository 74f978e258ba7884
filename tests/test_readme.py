"""The README's "Adding an algorithm" example runs as written."""

import re
from pathlib import Path

import torch

from fedlightning import FederatedDataModule, FederatedLoop

README = Path(__file__).parents[1] / "README.md"


def test_readme_plugin_example_trains(tmp_path):
    section = README.read_text().split("## Adding an algorithm", 1)[1].split("\n## ", 1)[0]
    namespace: dict = {}
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        exec(compile(block, str(README), "exec"), namespace)
    data = FederatedDataModule(dataset="digits", num_clients=6, partition="iid")
    torch.manual_seed(0)
    model = namespace["LabelSmoothing"](
        eps=0.1, network="mlp", num_classes=10, in_channels=1, image_size=8, lr=0.1
    )
    aggregator = namespace["ServerMomentum"](beta=0.5)
    loop = FederatedLoop(
        rounds=3,
        clients_per_round=3,
        aggregator=aggregator,
        run_dir=str(tmp_path),
        progress_bar=False,
    )
    metrics = loop.fit(model, datamodule=data)
    assert metrics["test_acc"] > 0.5  # chance is 0.1
    assert (
        set(aggregator.velocity)
        and "velocity" in torch.load(tmp_path / "last.ckpt", weights_only=True)["aggregator"]
    )

"""The quickstart's work as a hand-written PyTorch program (no fedlightning, no Lightning): the
reference for ``benchmarks/startup.py``.

scikit-learn's digits (the same stratified 80/20 split), 20 clients with Dirichlet(0.5) label
skew, the FedAvg CNN (5x5 convolutions of 32 and 64 channels with 2x2 pooling, 512 hidden units),
30 rounds of 10 clients x 2 local epochs of SGD (lr 0.05, momentum 0.5, batch 32), FedAvg
weighted by samples, the test accuracy after every round. Prints one JSON line with the time
spent in the rounds (``rounds_s``, from the first round's start to the last evaluation's end) and
the final accuracy; the caller measures the whole process.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn


def dirichlet_partition(labels: np.ndarray, clients: int, beta: float, rng, min_size: int = 10):
    while True:
        shards: list[list[int]] = [[] for _ in range(clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet([beta] * clients)) * len(idx)).astype(int)[:-1]
            for shard, part in zip(shards, np.split(idx, cuts), strict=True):
                shard.extend(part.tolist())
        if min(len(s) for s in shards) >= min_size:
            return [np.array(s) for s in shards]


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 2 * 2, 512), nn.ReLU(), nn.Linear(512, 10),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    digits = load_digits()
    x = digits.images.astype(np.float32)[:, None] / 16.0
    train_x, test_x, train_y, test_y = train_test_split(
        x, digits.target, test_size=0.2, stratify=digits.target, random_state=0
    )
    shards = dirichlet_partition(train_y, 20, 0.5, rng)
    train_x, train_y = torch.from_numpy(train_x), torch.from_numpy(train_y)
    test_x, test_y = torch.from_numpy(test_x), torch.from_numpy(test_y)
    model = cnn()
    start = time.perf_counter()
    accuracy = 0.0
    for _ in range(args.rounds):
        chosen = rng.choice(20, size=10, replace=False)
        states, sizes = [], []
        for cid in chosen:
            local = cnn()
            local.load_state_dict(model.state_dict())
            opt = torch.optim.SGD(local.parameters(), lr=0.05, momentum=0.5)
            idx = torch.from_numpy(shards[cid])
            for _ in range(2):
                for batch in idx[torch.randperm(len(idx))].split(32):
                    opt.zero_grad()
                    F.cross_entropy(local(train_x[batch]), train_y[batch]).backward()
                    opt.step()
            states.append(local.state_dict())
            sizes.append(len(idx))
        weights = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
        model.load_state_dict(
            {k: sum(w * s[k].double() for w, s in zip(weights, states, strict=True)).float()
             for k in states[0]}
        )  # fmt: skip
        with torch.no_grad():
            accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    rounds_s = time.perf_counter() - start
    print(json.dumps({"rounds_s": rounds_s, "test_acc": accuracy}))


if __name__ == "__main__":
    main()

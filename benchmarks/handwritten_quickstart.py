"""The quickstart's work as a hand-written PyTorch program (no fedlightning, no Lightning): the
reference for ``benchmarks/startup.py``.

``fedlightning fit -c configs/quickstart.yaml`` to the last bit, written directly: scikit-learn's
digits (the same stratified 80/20 split, standardised with the training pool's per-channel mean
and std), 20 clients with Dirichlet(0.5) label skew (the same draw, at least 10 samples each) and
10% of each client's samples held out for validation, the FedAvg CNN (5x5 convolutions of 32 and
64 channels with 2x2 pooling, 512 hidden units) initialised from seed 0, 30 rounds of 10 clients
sampled from ``(seed, round)`` x 2 local epochs of SGD (lr 0.05, momentum 0.5, batch 32, each
client's shuffles seeded from ``(seed, round, client)``), FedAvg weighted by samples (float64
accumulation), and after every round the global model's test accuracy and loss and the mean of
the clients' validation accuracies. The seeds are fedlightning's (a blake2b hash of
``(seed, purpose, round, client)``), written out here, so both programs train the same model.

Prints one JSON line with the time spent in the rounds (``rounds_s``, from the first round's
start to the last evaluation's end; torch.optim's one-time import of ``torch._dynamo`` is done
before it) and the final metrics; ``--out`` saves the final model's ``state_dict``. The caller
measures the whole process. torch's native CPU convolutions, as fedlightning's default.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn


def derive_seed(*parts: object) -> int:
    """fedlightning's seed of ``parts``: 63 bits of a blake2b hash of their repr."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def dirichlet_partition(labels: np.ndarray, clients: int, beta: float, seed: int, min_size: int):
    """Per class, Dir(beta) proportions cut the shuffled samples; redrawn until every client holds
    at least ``min_size`` samples."""
    rng = np.random.default_rng(seed)
    while True:
        shards: list[list[np.ndarray]] = [[] for _ in range(clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(clients, beta)))[:-1] * len(idx)).astype(
                np.int64
            )
            for shard, part in zip(shards, np.split(idx, cuts), strict=True):
                shard.append(part)
        if min(sum(len(p) for p in shard) for shard in shards) >= min_size:
            return [np.sort(np.concatenate(shard)) for shard in shards]


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
    parser.add_argument("--out", default=None, help="save the final model's state_dict here")
    args = parser.parse_args()
    seed, num_clients, per_round, epochs, batch = args.seed, 20, 10, 2, 32
    # torch's native CPU convolutions, as fedlightning runs by default (loop.onednn: oneDNN's
    # convolution backward corrupted the heap on torch 2.14.1): the same kernels, the same bits
    torch.backends.mkldnn.enabled = False
    torch.manual_seed(seed)
    model = cnn()  # the first draws after seeding, as the CLI builds the model
    digits = load_digits()
    images = digits.images.astype(np.float32)[:, None]
    train_x, test_x, train_y, test_y = train_test_split(
        images, digits.target, test_size=0.2, stratify=digits.target, random_state=0
    )
    train_x, test_x = torch.as_tensor(train_x), torch.as_tensor(test_x)
    mean = train_x.mean(dim=[0, 2, 3], keepdim=True)
    std = train_x.std(dim=[0, 2, 3], keepdim=True).clamp_min(1e-6)
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    train_y, test_y = torch.as_tensor(train_y, dtype=torch.int64), torch.as_tensor(test_y)
    clients, val_x, val_y, val_owner = [], [], [], []
    parts = dirichlet_partition(train_y.numpy(), num_clients, 0.5, seed, min_size=10)
    for cid, part in enumerate(parts):  # 10% of each client's samples for validation
        order = torch.as_tensor(part)[
            torch.randperm(len(part), generator=generator(derive_seed(seed, "val-split", cid)))
        ]
        held = math.floor(len(part) * 0.1)
        train = order[held:].sort().values
        clients.append((train_x[train], train_y[train]))
        val = order[:held].sort().values
        val_x.append(train_x[val])
        val_y.append(train_y[val])
        val_owner.append(torch.full((held,), cid))
    val_x, val_y, val_owner = torch.cat(val_x), torch.cat(val_y), torch.cat(val_owner)
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # torch.optim's first zero_grad imports torch._dynamo (its dynamo-disable decorator: seconds of
    # imports); fedlightning's process loads it with Lightning's imports, before its rounds. Done
    # here, before the clock, so that both sides' rounds hold rounds only (the whole process
    # still pays it)
    torch.optim.SGD(model.parameters(), lr=0.05).zero_grad()
    accuracy = loss = val_acc = 0.0
    start = time.perf_counter()
    for r in range(args.rounds):
        chosen = torch.randperm(num_clients, generator=generator(derive_seed(seed, "sample", r)))
        states, sizes = [], []
        for cid in chosen[:per_round].tolist():
            x, y = clients[cid]
            model.load_state_dict(global_state)
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
            shuffle = generator(derive_seed(seed, "fit", r, cid))
            for _ in range(epochs):
                order = torch.randperm(len(y), generator=shuffle)
                xs, ys = x[order], y[order]
                for i in range(0, len(ys), batch):
                    opt.zero_grad()
                    F.cross_entropy(model(xs[i : i + batch]), ys[i : i + batch]).backward()
                    opt.step()
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            sizes.append(len(y))
        for key, first in global_state.items():  # FedAvg: float64 sum of (n_i / n) * w_i
            total = torch.zeros(first.shape, dtype=torch.float64)
            for size, state in zip(sizes, states, strict=True):
                total.add_(state[key].to(torch.float64), alpha=size / sum(sizes))
            global_state[key] = total.to(first.dtype)
        model.load_state_dict(global_state)
        with torch.no_grad():
            logits = model(test_x)
            accuracy = float((logits.argmax(1) == test_y).sum()) / len(test_y)
            loss = float(F.cross_entropy(logits, test_y))
            hits = (model(val_x).argmax(1) == val_y).double()
            per_client = torch.bincount(val_owner, hits) / torch.bincount(val_owner)
            val_acc = float(per_client[torch.bincount(val_owner) > 0].mean())
    rounds_s = time.perf_counter() - start
    if args.out:
        torch.save(global_state, args.out)
    print(
        json.dumps(
            {"rounds_s": rounds_s, "test_acc": accuracy, "test_loss": loss, "val_acc": val_acc}
        )
    )


if __name__ == "__main__":
    main()

"""Every bad option is refused through the CLI before any training, with a message that names the
option, the bad value and what is allowed, and nothing is written (the run directory is not even
created). ``{made}`` in a case stands for a folder of prepared inputs: a finished run, broken and
foreign checkpoints, LEAF folders with bad data (see the ``made`` fixture)."""

import importlib.util
import io
import json
import re

import numpy as np
import pytest
import torch

from conftest import CONF, run_cli
from fedlightning.cli import main

AGG = "--loop.aggregator"
HF = ["--data.dataset", "huggingface", "--data.partition", "iid", "--data.root"]
CASES = [
    (["--loop.clients_per_round", "9"], r"clients_per_round=9 exceeds num_clients=8"),
    (["--loop.clients_per_round", "1.5"], r"loop.clients_per_round=1.5 .*fraction in \(0, 1\]"),
    (["--loop.min_clients", "5"], r"min_clients=5 exceeds clients_per_round=4"),
    (["--loop.rounds", "0"], r"loop.rounds=0 .*>= 1"),
    (["--loop.local_epochs", "0"], r"loop.local_epochs=0 .*>= 1"),
    (["--loop.eval_every", "0"], r"loop.eval_every=0 .*>= 1"),
    (["--loop.precision", "8-bit"], r"precision.*8-bit"),
    (["--ckpt_path", "/nonexistent/last.ckpt"], r"ckpt_path='/nonexistent/last.ckpt' does not exist"),
    (["--data.dataset", "imagenet"], r"unknown data set 'imagenet'.*digits"),
    (["--data.dataset", "cifar10", "--data.root", "/nonexistent"], r"'cifar10' not found under root='/nonexistent'.*download: true"),
    (["--data.beta", "0"], r"beta must be > 0.*got 0"),
    (["--data.beta", "-1"], r"beta must be > 0.*got -1"),
    (["--data.partition", "zipf"], r"partition.*zipf"),
    (["--data.val_fraction", "1.0"], r"val_fraction must lie in \[0, 1\), got 1.0"),
    (["--data.batch_size", "0"], r"batch_size.*must be >= 1"),
    (["--data.partition", "shards", "--data.shards_per_client", "0"], r"shards_per_client must be >= 1, got 0"),
    (["--data.num_clients", "100", "--data.beta", "0.01", "--data.min_size", "0"], r"client \d+ has 0 samples"),
    (["--model.init_args.network", "nope"], r"unknown model 'nope'"),
    (["--model.init_args.lr", "-1"], r"lr must be > 0, got -1"),
    (["--model.init_args.momentum", "1.5"], r"momentum must lie in \[0, 1\), got 1.5"),
    (["--model.init_args.optimizer", "rmsprop"], r"optimizer.*rmsprop"),
    (["--model", "fedlightning.clients.FedProx", "--model.mu", "-1"], r"mu must be >= 0, got -1"),
    ([AGG, "fedlightning.server.FedCross", f"{AGG}.alpha", "1.0"], r"alpha=1.0 .*\[0.5, 1.0\)"),
    ([AGG, "fedlightning.server.FedCross", f"{AGG}.alpha", "0.3"], r"alpha=0.3 .*\[0.5, 1.0\)"),
    ([AGG, "fedlightning.server.FedAvg", f"{AGG}.trim_beta", "0.6"], r"trim_beta must lie in \[0, 0.5\), got 0.6"),
    ([AGG, "fedlightning.server.FedAvg", f"{AGG}.aggregation", "mode"], r"aggregation.*mode"),
    (["--model", "fedlightning.clients.ScaffoldClient"], r"ScaffoldClient needs aggregator Scaffold, but loop.aggregator is FedAvg"),
    ([AGG, "fedlightning.server.Scaffold"], r"aggregator Scaffold .*serves client objective ScaffoldClient, but the model is ClientModule"),
    ([AGG, "fedlightning.server.FedNova"], r"aggregator FedNova .*serves client objective FedNovaClient, but the model is ClientModule"),
    (["--model", "fedlightning.clients.FML"], r"FML needs its uploads averaged with weighting='uniform'.*FedAvg has weighting='samples'"),
    (["--model", "fedlightning.clients.ScaffoldClient", AGG, "fedlightning.server.Scaffold",
      "--loop.precision", "16-mixed"], r"precision='16-mixed' is not supported by ScaffoldClient"),
    (["--model", "fedlightning.clients.ClientModule", "--model.networks", "[resnet10, vit_s8]",
      "--model.network_kwargs", "{width: 4}", AGG, "fedlightning.server.FedAvg"],
     r"model 'vit_s8' does not take \['width'\] in network_kwargs: its options are \[.*'embed_dim'"),
    (["--model", "fedlightning.clients.ClientModule", "--model.networks", "[resnet10, vit_s8]",
      "--model.network_kwargs", "{}", AGG, "fedlightning.server.FedAvg"], r"model.networks=\['resnet10', 'vit_s8'\].*must nest"),
    ([AGG, "fedlightning.server.FedAvgM", f"{AGG}.server_momentum", "1.0"], r"server_momentum=1.0 .*\[0, 1\)"),
    ([AGG, "fedlightning.server.FedAdam", f"{AGG}.tau", "0"], r"tau=0.0 .*> 0"),
    ([AGG, "fedlightning.server.InCo", f"{AGG}.inner", "fedlightning.server.FedCross"], r"inner='FedCross' .*one global model"),
    # loop options, walked one by one (issue 16)
    (["--loop.seed", "-1"], r"loop.seed=-1 is not allowed: expected an integer in \[0, 4294967295\]"),
    (["--loop.seed", str(2**70)], rf"loop.seed={2**70} is not allowed"),
    (["--loop.seed", str(2**32)], rf"loop.seed={2**32} is not allowed"),
    (["--loop.accelerator", "tpu"], r"loop.accelerator='tpu' .*one of auto, cpu, gpu"),
    (["--loop.run_dir", ""], r"loop.run_dir='' is not allowed: expected a directory path"),
    (["--loop.run_dir", "   "], r"loop.run_dir='   ' is not allowed"),
    (["--loop.run_dir", "{made}/file.txt"], r"loop.run_dir='.*file.txt' is a file"),
    (["--loop.run_dir", "{made}/file.txt/sub"], r"loop.run_dir='.*sub' lies under the file"),
    (["--loop.run_dir", "{made}/done"], r"already holds another run's results \(metrics.csv, last.ckpt, global.pt, models.pt\).*--loop.overwrite true"),
    (["--loop.run_dir", "{made}/done", "--ckpt_path", "{made}/copied.ckpt"], r"already holds another run's results"),
    (["--loop.log_every", "0"], r"loop.log_every=0 .*>= 1"),
    (["--loop.max_skipped_fraction", "1.5"], r"loop.max_skipped_fraction=1.5 .*\[0, 1\]"),
    (["--loop.max_skipped_fraction", "-0.1"], r"loop.max_skipped_fraction=-0.1 .*\[0, 1\]"),
    (["--loop.checkpoint_every", "0"], r"loop.checkpoint_every=0 .*>= 1"),
    (["--loop.local_steps", "0"], r"loop.local_steps=0 .*null or an integer >= 1"),
    (["--loop.min_clients", "0"], r"loop.min_clients=0 .*>= 1"),
    (["--loop.gradient_clip_val", "0"], r"loop.gradient_clip_val=0.0 .*> 0"),
    (["--loop.gradient_clip_val", "-1"], r"loop.gradient_clip_val=-1.0 .*> 0"),
    (["--loop.gradient_clip_algorithm", "foo"], r"gradient_clip_algorithm.*foo"),
    (["--loop.num_threads", "0"], r"loop.num_threads=0 .*>= 1"),
    (["--loop.devices", "2"], r"loop.devices=2 .*expected 1"),
    (["--loop.client_state", "cloud"], r"client_state.*cloud"),
    (["--loop.on_round_failure", "ignore"], r"on_round_failure.*ignore"),
    (["--loop.fit_with", "magic"], r"fit_with.*magic"),
    (["--loop.clients_per_round", "0"], r"loop.clients_per_round=0 .*an integer >= 1"),
    (["--loop.rounds", "-3"], r"loop.rounds=-3 .*>= 1"),
    (["--loop.eval_every", "-1"], r"loop.eval_every=-1 .*>= 1"),
    (["--loop.local_epochs", "-2"], r"loop.local_epochs=-2 .*>= 1"),
    (["--loop.backend", "NoSuchBackend"], r"NoSuchBackend"),
    (["--loop.backend", "CohortBackend", "--model", "user_clients.ScheduledClient"], r"loop.backend=CohortBackend cannot train this run: it does not step LR schedulers"),
    (["--loop.backend", "RayBackend", "--loop.backend.num_workers", "0"], r"num_workers=0 .*>= 1"),
    (["--loop.backend", "RayBackend", "--loop.backend.num_cpus_per_client", "0"], r"num_cpus_per_client=0 .*>= 1"),
    (["--loop.backend", "RayBackend", "--loop.backend.num_gpus_per_client", "-1"], r"num_gpus_per_client=-1.0 .*>= 0"),
    (["--data.num_clients", "0"], r"num_clients must be >= 1, got 0"),
    (["--data.val_fraction", "-0.1"], r"val_fraction must lie in \[0, 1\), got -0.1"),
    (["--data.resize", "0"], r"resize must be a positive image size or null, got 0"),
    (["--data.batch_size", "-1"], r"batch_size.*must be >= 1.*-1"),
    (["--model.init_args.lr", "0"], r"lr must be > 0, got 0"),
    # checkpoints: unreadable, inconsistent, or another run's (one line each, never a traceback)
    (["--ckpt_path", "{made}/empty.ckpt"], r"ckpt_path='.*empty.ckpt' is empty \(0 bytes\)"),
    (["--ckpt_path", "{made}/garbage.ckpt"], r"ckpt_path='.*garbage.ckpt' cannot be read .*truncated, corrupted or not a fedlightning checkpoint"),
    (["--ckpt_path", "{made}/truncated.ckpt"], r"ckpt_path='.*truncated.ckpt' cannot be read"),
    (["--ckpt_path", "{made}/pickle.ckpt"], r"ckpt_path='.*pickle.ckpt' cannot be read"),
    (["--ckpt_path", "{made}/list.ckpt"], r"ckpt_path='.*list.ckpt' is not a fedlightning checkpoint"),
    (["--ckpt_path", "{made}/round-5.ckpt"], r"ckpt_path='.*round-5.ckpt' is inconsistent: round=-5"),
    (["--ckpt_path", "{made}/round-str.ckpt"], r"is inconsistent: 'round' is str, expected int"),
    (["--ckpt_path", "{made}/no-history.ckpt"], r"is inconsistent: 'history' is NoneType, expected list"),
    (["--ckpt_path", "{made}/format1.ckpt"], r"has format 'fedlightning-checkpoint-1' but this fedlightning reads 'fedlightning-checkpoint-4'"),
    # format 2 (before the identity held the resolved config) cannot tell a changed lr: refused
    (["--ckpt_path", "{made}/format2.ckpt"], r"has format 'fedlightning-checkpoint-2' but this fedlightning reads 'fedlightning-checkpoint-4': resume with the fedlightning that wrote it, or start anew"),
    # format 3 (FedCross, InCo and client-level DP wrote their own state layout): refused
    (["--ckpt_path", "{made}/format3.ckpt"], r"has format 'fedlightning-checkpoint-3' but this fedlightning reads 'fedlightning-checkpoint-4'"),
    (["--ckpt_path", "{made}/other-data.ckpt"], r"partition_hash is 'feedbeef' in the checkpoint but '\w+' in this run; resume with the same data options and the same data on disk"),
    (["--ckpt_path", "{made}/no-config.ckpt"], r"does not say which run wrote it \(no resolved config in its identity\)"),
    (["--ckpt_path", "{made}/bad-aggregator.ckpt"], r"the checkpoint's FedAvg state weights \(declared: a copy of the initial server model\) is missing"),
    (["--ckpt_path", "{made}/done"], r"ckpt_path='.*done' is a directory: give the checkpoint file"),
    (["--ckpt_path", "{made}/done/last.ckpt", "--loop.seed", "1"], r"loop.seed is 0 in the checkpoint but 1 in this run; resume with the same --loop.seed"),
    (["--ckpt_path", "{made}/done/last.ckpt", AGG, "fedlightning.server.FedAvgM"], r"loop.aggregator is 'fedlightning.server.FedAvg' in the checkpoint but 'fedlightning.server.FedAvgM'"),
    (["--ckpt_path", "{made}/done/last.ckpt", AGG, "fedlightning.server.FedAvg", f"{AGG}.aggregation", "median"], r"loop.aggregator.init_args.aggregation is 'mean' in the checkpoint but 'median'"),
    (["--ckpt_path", "{made}/done/last.ckpt", "--model", "fedlightning.clients.FedProx"], r"model is 'fedlightning.clients.ClientModule' in the checkpoint but 'fedlightning.clients.FedProx'"),
    (["--ckpt_path", "{made}/done/last.ckpt", "--model.init_args.network_kwargs", "{hidden: [32]}"], r"model.init_args.network_kwargs.hidden is \[64\] in the checkpoint but \[32\]"),
    (["--ckpt_path", "{made}/done/last.ckpt", "--data.num_clients", "10"], r"data.num_clients is 8 in the checkpoint but 10"),
    (["--ckpt_path", "{made}/done/last.ckpt", "--data.beta", "0.5"], r"data.beta is 1.0 in the checkpoint but 0.5 in this run; resume with the same --data.beta"),
    (["--ckpt_path", "{made}/done/last.ckpt", "--loop.client_state", "disk"], r"loop.client_state is 'memory' in the checkpoint but 'disk'"),
    # LEAF data that would train to garbage
    (["--data.dataset", "femnist", "--data.partition", "natural", "--data.root", "{made}/leaf_nan"], r"LEAF json '.*leaf_nan/train/a.json', user 'u1': 1 sample\(s\) have NaN/Inf inputs"),
    (["--data.dataset", "femnist", "--data.partition", "natural", "--data.root", "{made}/leaf_fraction"], r"LEAF json '.*leaf_fraction/train/a.json', user 'u0': labels must be integers, got 1.5"),
    (["--data.dataset", "femnist", "--data.partition", "natural", "--data.root", "{made}/leaf_text"], r"LEAF json '.*leaf_text/train/a.json', user 'u0': labels must be integers"),
    (["--data.dataset", "femnist", "--data.partition", "natural", "--data.root", "{made}/leaf_range"], r"LEAF json '.*leaf_range/test/t.json', user 't0' \(FEMNIST\): labels must lie in \[0, 62\), got range \[0, 70\]"),
    (["--data.dataset", "femnist", "--data.partition", "natural", "--data.root", "{made}/leaf_empty_test"], r"the LEAF test files under '.*leaf_empty_test/test' hold no samples"),
    # Hugging Face data sets on disk that would fail deep in PIL/numpy or train to garbage (issue 26)
    ([*HF, "{made}/hf_corrupt"], r"data.root='.*hf_corrupt' split 'train', row 5, column 'image' \(file 'img5.png'\) is not a readable image: \w+Error: .*\(its bytes\)"),
    ([*HF, "{made}/hf_folder", "--data.source_options", "{format: imagefolder}"], r"split 'train', row \d+, column 'image' \(file '.*hf_folder/train/b/1.png'\) is not a readable image"),
    ([*HF, "{made}/hf_missing"], r"data.root='.*hf_missing' split 'train', row 4, column 'image' has no image \(None\)"),
    ([*HF, "{made}/hf_text"], r"split 'train', row 0, column 'image' holds str 'img0.png', not an image or numbers"),
    ([*HF, "{made}/hf_fraction"], r"split 'train', row 3, column 'label' holds the label .*0.5.*: labels must be whole numbers"),
    # plug-ins, loggers, files and paths (issue 26): one line, never a traceback
    ([AGG, "user_clients.RaisingAggregator"], r"user_clients.RaisingAggregator\(\.\.\.\) raised ValueError: beta=0.5 needs SERVER_KEY in the environment \(at user_clients.py:\d+\)"),
    (["--model", "user_clients.RaisingObjective"], r"user_clients.RaisingObjective\(\.\.\.\) raised RuntimeError: no label smoothing table for eps=0.1"),
    (["--config", "{made}/latin1.yaml"], r"--config '.*latin1.yaml' is not UTF-8 text: byte 0xe9 at line 2, column 19 cannot be decoded; save the file as UTF-8"),
    # one value per option (issue 33): a key twice in one YAML mapping, an option twice with two values
    (["--config", "{made}/twice.yaml"], r"--config '.*twice.yaml' gives loop.rounds twice \(line 2 and line 4\) in one mapping, and YAML would silently keep the last: keep one of them$"),
    (["--config", "{made}/dp_twice.yaml"], r"gives loop.aggregator.init_args.noise_multiplier twice \(line 5 and line 6\)"),
    (["--loop.rounds", "2", "--loop.rounds=3"], r"--loop.rounds is given twice on the command line, as '2' and as '3': give it once"),
    # ... in every spelling (issue 43 item 2): init_args or not, abbreviated, in a group's file, inline
    (["--model.lr", "0.1", "--model.init_args.lr", "0.05"], r"--model.lr '0.1' and --model.init_args.lr '0.05' set the same option \(model.lr\) on the command line: give it once, in one spelling"),
    (["--loop.rounds", "2", "--loop.round", "3"], r"error: unrecognized arguments: --loop.round 3; the closest: --loop.rounds"),
    (["--loop", "{made}/loop_twice.yaml"], r"--loop '.*loop_twice.yaml' gives rounds twice \(line 1 and line 3\) in one mapping"),
    ([AGG, "{made}/momentum_twice.yaml"], r"--loop.aggregator '.*momentum_twice.yaml' gives init_args.server_momentum twice \(line 3 and line 4\)"),
    ([AGG, '{"class_path": "FedAvgM", "init_args": {"server_momentum": 0.9, "server_momentum": 0.5}}'], r"the value of --loop.aggregator gives init_args.server_momentum twice \(column 41 and column 65\) in one mapping"),
    ([AGG, "{class_path: FedAvgM, init_args: {server_momentum: 0.9}}", f"{AGG}.server_momentum", "0.5"], r"--loop.aggregator's init_args.server_momentum '0.9' and --loop.aggregator.server_momentum '0.5' set the same option \(loop.aggregator.server_momentum\)"),
    (["--loop.run_dir", "{made}/" + "r" * 300], r"loop.run_dir='.*'... is not allowed: its name 'r{30}'... is 300 bytes long, more than the 255 bytes a file name may have"),
    (["--ckpt_path", "{made}/" + "c" * 300 + ".ckpt"], r"the name 'c{40}'... is 305 bytes long, more than the 255 bytes"),
    (["--data.dataset", "femnist", "--data.root", "{made}/" + "d" * 256], r"the name 'd{40}'... is 256 bytes long"),
]  # fmt: skip
#: Lightning loggers whose package this machine lacks: refused naming it (issue 26 item 4)
for logger, package in (("MLFlowLogger", "mlflow>=1.0.0"), ("CometLogger", "comet-ml>=3.44.4")):
    if importlib.util.find_spec(package.split(">")[0].replace("-", "_")) is None:
        CASES.append(
            ([f"--loop.loggers+=lightning.pytorch.loggers.{logger}"],
             rf"lightning.pytorch.loggers.\w+.{logger} needs {re.escape(package)}, which is not installed: pip install '{re.escape(package)}'")
        )  # fmt: skip
NO_GPU = [
    (["--loop.accelerator", "gpu"], r"loop.accelerator='gpu' but no CUDA GPU is available"),
    (["--loop.accelerator", "cuda"], r"loop.accelerator='cuda' but no CUDA GPU is available"),
]  # fmt: skip
if not torch.cuda.is_available():
    CASES += NO_GPU


#: the identity a format-2 checkpoint held: no resolved config (no lr, epochs, batch size...)
OLD_IDENTITY = {
    "objective": "fedlightning.clients.base.ClientModule", "aggregator": "fedlightning.server.fedavg.FedAvg",
    "aggregator_config": {"weighting": "samples"}, "dataset": "digits", "num_clients": 8, "seed": 0,
    "client_state": "memory", "library_version": "0.1.0",
}  # fmt: skip


def _leaf(root, train_users, test_users):
    """A LEAF folder: ``train/a.json`` and ``test/t.json`` with ``{user: (x rows, labels)}``."""
    for split, users in (("train", train_users), ("test", test_users)):
        (root / split).mkdir(parents=True)
        blob = {
            "users": list(users),
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
        }
        (root / split / ("a.json" if split == "train" else "t.json")).write_text(json.dumps(blob))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Inputs the cases name as ``{made}/...`` (one tiny 2-round run, then files derived from it)."""
    root = tmp_path_factory.mktemp("made")
    run_cli(root / "done", "--loop.rounds", "2")
    checkpoint = root / "done" / "last.ckpt"
    data = checkpoint.read_bytes()
    (root / "file.txt").write_text("not a directory\n")
    (root / "copied.ckpt").write_bytes(data)  # a checkpoint kept outside its run directory
    (root / "empty.ckpt").write_bytes(b"")
    (root / "garbage.ckpt").write_bytes(b"\x00garbage, not a checkpoint" * 40)
    (root / "truncated.ckpt").write_bytes(data[: len(data) // 2])
    (root / "pickle.ckpt").write_bytes(  # a pickle that would run code: weights_only refuses it
        b"cos\nsystem\n(S'echo pwned'\ntR."
    )
    torch.save([1, 2, 3], root / "list.ckpt")
    state = torch.load(checkpoint, weights_only=True)
    for name, change in {
        "round-5": {"round": -5},
        "round-str": {"round": "2"},
        "no-history": {"history": None},
        "format1": {"format": "fedlightning-checkpoint-1"},
        "format2": {"format": "fedlightning-checkpoint-2", "identity": OLD_IDENTITY},
        "format3": {"format": "fedlightning-checkpoint-3"},
        "no-config": {"identity": OLD_IDENTITY},
        "other-data": {"identity": {**state["identity"], "partition_hash": "feedbeef"}},
        "bad-aggregator": {"aggregator": {"unexpected": torch.zeros(1)}},
    }.items():
        torch.save({**state, **change}, root / f"{name}.ckpt")
    image = [0.5] * 784
    _leaf(
        root / "leaf_nan",
        {"u0": ([image], [1]), "u1": ([image, [float("nan")] + image[1:]], [2, 3])},
        {"t0": ([image], [1])},
    )
    _leaf(root / "leaf_fraction", {"u0": ([image], [1.5])}, {"t0": ([image], [1])})
    _leaf(root / "leaf_text", {"u0": ([image], ["cat"])}, {"t0": ([image], [1])})
    _leaf(root / "leaf_range", {"u0": ([image], [1])}, {"t0": ([image, image], [0, 70])})
    _leaf(root / "leaf_empty_test", {"u0": ([image], [1])}, {})
    _hugging_face(root)
    (root / "latin1.yaml").write_bytes(b"loop:\n  rounds: 2  # caf\xe9\n")
    (root / "twice.yaml").write_text("loop:\n  rounds: 2\n  clients_per_round: 4\n  rounds: 3\n")
    (root / "loop_twice.yaml").write_text("rounds: 2\nclients_per_round: 4\nrounds: 3\n")
    (root / "momentum_twice.yaml").write_text(
        "class_path: fedlightning.server.FedAvgM\ninit_args:\n  server_momentum: 0.9\n"
        "  server_momentum: 0.5\n"
    )
    (root / "dp_twice.yaml").write_text(
        "loop:\n  aggregator:\n    class_path: fedlightning.privacy.ClientLevelDP\n"
        "    init_args:\n      noise_multiplier: 1.0\n      noise_multiplier: 0.01\n"
    )
    return root


def _png(seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (8, 8), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _hugging_face(root):
    """Tiny Hugging Face data sets on disk with one bad sample each (``{made}/hf_*``)."""
    datasets = pytest.importorskip("datasets")
    n, labels = 12, [i % 3 for i in range(12)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    images = [{"bytes": _png(i), "path": None} for i in range(n)]
    corrupt = [
        *images[:5],
        {"bytes": b"\x89PNG\r\n\x1a\nnot a png", "path": "img5.png"},
        *images[6:],
    ]
    pixels = [np.zeros((8, 8)).tolist()] * n
    for name, columns, kind in [
        ("hf_corrupt", {"image": corrupt, "label": labels}, features),
        ("hf_missing", {"image": [None if i == 4 else im for i, im in enumerate(images)], "label": labels}, features),
        ("hf_text", {"image": [f"img{i}.png" for i in range(n)], "label": labels}, None),
        ("hf_fraction", {"image": pixels, "label": [0.5 if i == 3 else float(c) for i, c in enumerate(labels)]}, None),
    ]:  # fmt: skip
        split = datasets.Dataset.from_dict(columns, features=kind)
        datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(root / name))
    for split in ("train", "test"):
        for label in ("a", "b"):
            folder = root / "hf_folder" / split / label
            folder.mkdir(parents=True)
            for i in range(3):
                (folder / f"{i}.png").write_bytes(_png(i))
    (root / "hf_folder" / "train" / "b" / "1.png").write_bytes(b"garbage, not a png")


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(a)[-60:] for a, _ in CASES])
def test_bad_option_is_refused_before_training(tmp_path, capsys, monkeypatch, made, args, message):
    monkeypatch.setattr("sys.argv", ["fedlightning"])
    before = {p: p.read_bytes() for p in (made / "done").iterdir() if p.is_file()}
    args = [a.replace("{made}", str(made)) for a in args]
    if "--loop.run_dir" not in args:  # the cases that name one give it once
        args = ["--loop.run_dir", str(tmp_path / "bad"), *args]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONF / "tiny.yaml"), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err, re.S), err[-2000:]
    assert "Traceback" not in err
    assert not (tmp_path / "bad").exists()  # nothing written, not even the directory
    # the finished run the cases resume from or point at is untouched, byte for byte
    assert {p: p.read_bytes() for p in (made / "done").iterdir() if p.is_file()} == before


def test_malformed_leaf_json_is_refused(cli, tmp_path, capsys):
    for split in ("train", "test"):
        (tmp_path / "leaf" / split).mkdir(parents=True)
    (tmp_path / "leaf" / "train" / "bad.json").write_text(
        json.dumps({"users": ["u"], "user_data": {}})
    )
    (tmp_path / "leaf" / "test" / "t.json").write_text(json.dumps({"users": [], "user_data": {}}))
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path / "bad", "--data.dataset", "femnist", "--data.partition", "natural",
            "--data.root", str(tmp_path / "leaf"))  # fmt: skip
    assert exit_info.value.code == 2
    assert re.search(r"malformed LEAF json '.*bad.json'", capsys.readouterr().err)
    assert not (tmp_path / "bad" / "metrics.csv").exists()

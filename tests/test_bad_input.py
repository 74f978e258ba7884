"""Every bad option is refused through the CLI before any training, with a message that names the
option, the bad value and what is allowed."""

import json
import re

import pytest

AGG = "--loop.aggregator"
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
    (["--model", "fedlightning.clients.ScaffoldClient"], r"ScaffoldClient needs \['c'\].*FedAvg"),
    ([AGG, "fedlightning.server.Scaffold"], r"Scaffold needs \['delta_c'\].*ClientModule"),
    ([AGG, "fedlightning.server.FedNova"], r"FedNova needs .*ClientModule"),
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
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(a)[-60:] for a, _ in CASES])
def test_bad_option_is_refused_before_training(cli, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path / "bad", *args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err, re.S), err[-2000:]
    assert not (tmp_path / "bad" / "metrics.csv").exists()
    assert not (tmp_path / "bad" / "last.ckpt").exists()


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

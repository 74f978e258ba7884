"""W&B without an API key: logs offline under the run directory, with the metrics, the resolved
config, the partition and the run's figures; a resumed run continues the same W&B run id; W&B's
own console output stays within a line or two (issue 34 item 5)."""

import torch


def test_offline_wandb_run_holds_metrics_and_figures_and_resumes_same_id(
    cli, tmp_path, monkeypatch, capfd, caplog
):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    monkeypatch.delenv("WANDB_QUIET", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc credentials
    run = tmp_path / "run"
    wandb = ["--loop.wandb", "true", "--loop.wandb_project", "tests"]
    cli(run, "--loop.rounds", "2", *wandb)
    err = capfd.readouterr().err
    about_wandb = [line for line in err.splitlines() if "wandb" in line.lower()]
    assert len(about_wandb) <= 2, about_wandb  # W&B alone printed 34 lines a run
    assert "wandb sync" in caplog.text  # the run's own line says how to sync
    offline = sorted((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    record = next(offline[0].glob("run-*.wandb")).read_bytes()
    for name in (b"test_acc", b"val_acc", b"partition", b"clients_per_round"):
        assert name in record  # metrics, the partition table and the resolved config
    images = sorted(p.name.split("_")[0] for p in offline[0].glob("files/media/images/*.png"))
    assert images == ["curves", "partition"]
    run_id = torch.load(run / "last.ckpt", weights_only=True)["wandb_id"]
    assert run_id and offline[0].name.endswith(run_id)
    cli(run, "--loop.rounds", "3", *wandb, "--ckpt_path", str(run / "last.ckpt"))
    assert {p.name.rsplit("-", 1)[1] for p in (run / "wandb").glob("offline-run-*")} == {run_id}

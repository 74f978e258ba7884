"""W&B without an API key: logs offline under the run directory, with the metrics, the resolved
config, the partition and the run's figures; a resumed run continues the same W&B run id; W&B's
own console output stays within a line or two (issue 34 item 5)."""

import logging

import torch


def test_offline_wandb_run_holds_metrics_and_figures_and_resumes_same_id(
    cli, tmp_path, monkeypatch, capfd
):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    monkeypatch.delenv("WANDB_QUIET", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc credentials
    ours = []  # fedlightning's own log lines, whatever earlier tests did to logging's handlers
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: ours.append(record.getMessage())
    fedlightning_log = logging.getLogger("fedlightning")
    monkeypatch.setattr(fedlightning_log, "disabled", False)
    level = fedlightning_log.level
    fedlightning_log.setLevel(logging.WARNING)
    fedlightning_log.addHandler(handler)
    run = tmp_path / "run"
    wandb = ["--loop.wandb", "true", "--loop.wandb_project", "tests"]
    try:
        cli(run, "--loop.rounds", "2", *wandb)
    finally:
        fedlightning_log.removeHandler(handler)
        fedlightning_log.setLevel(level)
    err = capfd.readouterr().err
    about_wandb = [line for line in err.splitlines() if "wandb" in line.lower()]
    assert len(about_wandb) <= 2, about_wandb  # W&B alone printed 34 lines a run
    assert any("wandb sync" in line for line in ours)  # the run's own line says how to sync
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

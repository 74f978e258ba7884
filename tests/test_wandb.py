"""W&B without an API key: logs offline under the run directory, with the metrics, the resolved
config and the partition; a resumed run continues the same W&B run id."""

import torch


def test_offline_wandb_run_holds_metrics_and_resumes_same_id(cli, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc credentials
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    cli(run, "--loop.rounds", "2", "--loop.wandb", "true", "--loop.wandb_project", "tests")
    offline = sorted((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    record = next(offline[0].glob("run-*.wandb")).read_bytes()
    for name in (b"test_acc", b"val_acc", b"partition", b"clients_per_round"):
        assert name in record  # metrics, the partition table and the resolved config
    run_id = torch.load(run / "last.ckpt", weights_only=True)["wandb_id"]
    assert run_id and offline[0].name.endswith(run_id)
    cli(
        run,
        "--loop.rounds",
        "3",
        "--loop.wandb",
        "true",
        "--loop.wandb_project",
        "tests",
        "--ckpt_path",
        str(run / "last.ckpt"),
    )
    assert {p.name.rsplit("-", 1)[1] for p in (run / "wandb").glob("offline-run-*")} == {run_id}

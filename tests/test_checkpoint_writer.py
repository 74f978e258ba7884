"""The background checkpoint writer: one write in flight, a snapshot later rounds cannot change,
its ``done`` run on the loop's thread once the file is on disk, its error raised on that thread."""

import errno
import logging
import threading

import pytest
import torch

from fedlightning.errors import StorageError
from fedlightning.loop import checkpoint as checkpoint_module
from fedlightning.loop.checkpoint_writer import CheckpointWriter


def _checkpoint(value: float) -> dict:
    weights = {"w": torch.full((3,), value)}
    return {
        "round": 1, "aggregator": {"weights": weights}, "clients": {"mode": "memory", "states": {}},
        "history": [{"round": 1, "test_acc": value}], "meters": {},
    }  # fmt: skip


def test_the_file_holds_the_state_of_the_moment_it_was_submitted(tmp_path):
    writer = CheckpointWriter()
    checkpoint = _checkpoint(1.0)
    done = []
    writer.submit(checkpoint, tmp_path / "last.ckpt", lambda: done.append(threading.get_ident()))
    # the next round updates the server state and the history in place while the write runs
    checkpoint["aggregator"]["weights"]["w"].add_(5.0)
    checkpoint["history"][0]["test_acc"] = 9.0
    writer.close()
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert torch.equal(saved["aggregator"]["weights"]["w"], torch.full((3,), 1.0))
    assert saved["history"][0]["test_acc"] == 1.0
    assert done == [threading.get_ident()]  # on this thread, after the write


def test_one_write_in_flight_each_waits_for_the_previous(tmp_path, monkeypatch):
    order, release = [], threading.Event()
    real = checkpoint_module.atomic_save

    def slow(obj, path, on_cpu=False):
        order.append(("start", obj["round"]))
        release.wait(5)
        real(obj, path, on_cpu)
        order.append(("end", obj["round"]))

    monkeypatch.setattr("fedlightning.loop.checkpoint_writer.atomic_save", slow)
    writer = CheckpointWriter()
    writer.submit({**_checkpoint(1.0), "round": 1}, tmp_path / "last.ckpt", lambda: None)
    threading.Timer(0.2, release.set).start()
    writer.submit({**_checkpoint(2.0), "round": 2}, tmp_path / "last.ckpt", lambda: None)
    writer.close()
    assert order == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["round"] == 2


def test_a_failed_write_is_raised_on_the_loops_thread_and_done_does_not_run(tmp_path, monkeypatch):
    def full(obj, target, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module.torch, "save", full)
    writer = CheckpointWriter()
    done = []
    writer.submit(_checkpoint(1.0), tmp_path / "last.ckpt", lambda: done.append(1))
    with pytest.raises(StorageError, match="could not write last.ckpt .* no space left"):
        writer.close()
    assert done == [] and not list(tmp_path.iterdir())


def test_closing_while_another_error_goes_up_logs_the_failed_write(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(
        checkpoint_module.torch,
        "save",
        lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EROFS, "ro")),
    )
    writer = CheckpointWriter()
    writer.submit(_checkpoint(1.0), tmp_path / "last.ckpt", lambda: None)
    with caplog.at_level(logging.ERROR, logger="fedlightning"):
        writer.close(raise_error=False)
    assert "the last checkpoint could not be written" in caplog.text

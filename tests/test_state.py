import pickle
import random
from pathlib import Path

import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.state import ClientStore


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_store_round_trips_and_copies_to_cpu(mode, tmp_path):
    store = ClientStore(mode, tmp_path / "clients")
    assert store.get(3) == {}
    state = {"c": torch.ones(2), "nested": {"m": [torch.zeros(1)]}, "step": 4}
    store.put(3, state)
    state["c"].add_(1)  # the store holds a copy, not the caller's tensor
    got = store.get(3)
    assert torch.equal(got["c"], torch.ones(2)) and got["step"] == 4
    assert 3 in store and len(store) == 1
    clone = ClientStore(mode, tmp_path / "clients")
    clone.load_state_dict(store.state_dict())
    assert torch.equal(clone.get(3)["nested"]["m"][0], torch.zeros(1))


def test_disk_store_keeps_checkpointed_versions_until_commit(tmp_path):
    store = ClientStore("disk", tmp_path)
    store.put(0, {"c": torch.zeros(1)})
    checkpoint = store.state_dict()  # as written into last.ckpt
    store.commit()
    store.put(0, {"c": torch.ones(1)})  # next round: a new version, the old file is kept
    resumed = ClientStore("disk", tmp_path)
    resumed.load_state_dict(checkpoint)  # a run killed before the next checkpoint
    assert torch.equal(resumed.get(0)["c"], torch.zeros(1))
    store.commit()  # after the next checkpoint the superseded version goes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.2.pt"]


def test_mode_mismatch_is_refused(tmp_path):
    memory = ClientStore()
    with pytest.raises(ValueError, match="client_state"):
        ClientStore("disk", tmp_path).load_state_dict(memory.state_dict())
    with pytest.raises(ValueError, match="client_state must be"):
        ClientStore("cloud")


class Killed(BaseException):
    """The process dies here (a BaseException: no ``except`` of the store catches it)."""


class Filesystem:
    """Counts the disk tier's file operations (writes, deletions) and kills the process at the
    ``kill_at``-th, just ``before`` or just after it takes effect."""

    def __init__(self, monkeypatch, kill_at: int, before: bool) -> None:
        self.count, self.kill_at, self.before = 0, kill_at, before
        for owner, name in ((torch, "save"), (Path, "unlink"), (Path, "touch")):
            monkeypatch.setattr(owner, name, self.wrap(getattr(owner, name)))

    def wrap(self, operation):
        def operation_or_kill(*args, **kwargs):
            self.count += 1
            if self.count == self.kill_at and self.before:
                raise Killed
            result = operation(*args, **kwargs)
            if self.count == self.kill_at:
                raise Killed
            return result

        return operation_or_kill

    def checkpoint(self, store, expected, durable):
        """Write a checkpoint (an operation that can be killed too), then commit."""
        self.count += 1
        snapshot = (store.state_dict(), dict(expected))
        if self.count == self.kill_at and self.before:
            raise Killed
        durable[0] = snapshot
        if self.count == self.kill_at:
            raise Killed
        store.commit(snapshot[0])


def _rounds(store, fs, expected, durable, rng, rounds, clients=6) -> int:
    """Rounds of a run: some clients get new state (or have it cleared), then a checkpoint.
    Returns how many states were cleared."""
    cleared = 0
    for _ in range(rounds):
        for cid in rng.sample(range(clients), 3):
            value = rng.random()
            state = {} if value < 0.3 else {"c": torch.tensor([value])}
            store.put(cid, state)
            cleared += not state and cid in expected
            expected.pop(cid, None)
            if state:
                expected[cid] = value
        fs.checkpoint(store, expected, durable)
    return cleared


def _resume(path, durable):
    store = ClientStore("disk", path)
    state, expected = durable[0]
    store.load_state_dict(state)
    return store, dict(expected)


def _holds(store, expected, clients=6):
    got = {c: float(store.get(c)["c"]) for c in range(clients) if store.get(c)}
    assert got == {c: pytest.approx(v) for c, v in expected.items()}
    assert len(store) == len(expected) and store.client_ids() == sorted(expected)


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
def test_disk_store_resumes_exactly_after_a_kill_at_any_file_operation(
    tmp_path, monkeypatch, before
):
    """A run killed just before or just after any file operation (a state file written, a
    superseded one deleted, the checkpoint written, stale files deleted when the resumed run
    opens the folder, even killed again there) resumes with exactly its last checkpoint's
    states, and keeps one file per stateful client once it has checkpointed again."""
    total = None
    kill_at = 1
    while total is None or kill_at <= total:
        path = tmp_path / f"{before}-{kill_at}"
        rng = random.Random(4)  # the same run every time, killed at another place
        fs = Filesystem(monkeypatch, kill_at, before)
        store, expected = ClientStore("disk", path), {}
        durable = [(store.state_dict(), {})]  # a new run resumes from nothing
        try:
            cleared = _rounds(store, fs, expected, durable, rng, rounds=5)
            total = fs.count  # no kill happened: every operation of the run counted
        except Killed:
            store, expected = _resume(path, durable)
            fs.kill_at = fs.count + 1 + kill_at % 3  # killed again while deleting stale files?
            try:
                store.open()
            except Killed:
                store, expected = _resume(path, durable)
                store.open()
            _holds(store, expected)
            fs.kill_at = -1  # the resumed run runs to its end
            _rounds(store, fs, expected, durable, rng, rounds=2)
            _holds(store, expected)
            files = sorted(p.name for p in path.iterdir())
            assert [name.split(".")[0] for name in files] == sorted(str(c) for c in expected)
        kill_at += 1
    assert total > 20 and cleared == 2  # writes, deletions, checkpoints, states cleared


def test_disk_store_checkpoint_and_memory_do_not_grow_with_the_clients(tmp_path):
    sizes = {}
    for clients in (10, 2000):
        store = ClientStore("disk", tmp_path / str(clients))
        for cid in range(clients):
            store.put(cid, {"c": torch.zeros(1)})
        sizes[clients] = len(pickle.dumps(store.state_dict()))
        assert store._disk._live.nbytes <= 16 * clients  # one int64 per client id (grown x2)
    assert sizes[2000] <= sizes[10] + 4 and sizes[2000] < 200


def test_disk_store_refuses_a_folder_that_does_not_hold_the_checkpoint(tmp_path):
    store = ClientStore("disk", tmp_path / "a")
    for cid in range(3):
        store.put(cid, {"c": torch.full((1,), float(cid))})
    checkpoint = store.state_dict()
    store.put(1, {"c": torch.ones(1)})
    store.commit()  # a later checkpoint of this run deleted version 2 of client 1
    with pytest.raises(ConfigurationError, match="does not hold this checkpoint's client states"):
        ClientStore("disk", tmp_path / "a").load_state_dict(checkpoint)
    # a refused checkpoint leaves the store as it was (checked before anything is replaced)
    before = store.state_dict()
    with pytest.raises(ConfigurationError, match="does not hold this checkpoint's client states"):
        store.load_state_dict(checkpoint)
    assert store.state_dict() == before and store.client_ids() == [0, 1, 2]
    assert store.get(1)["c"].item() == 1.0
    other = ClientStore("disk", tmp_path / "b")  # another run's (empty) folder
    with pytest.raises(ConfigurationError, match=r"3 clients with state.*found 0"):
        other.load_state_dict(checkpoint)


def test_commit_deletes_only_what_a_durable_checkpoint_no_longer_needs(tmp_path):
    """With a checkpoint written in the background, commit(snapshot) keeps the files of versions
    written after that snapshot was taken."""
    store = ClientStore("disk", tmp_path)
    store.put(0, {"c": torch.zeros(1)})
    older = store.state_dict()
    store.put(0, {"c": torch.ones(1)})  # version 2 supersedes version 1
    newer = store.state_dict()
    store.put(0, {"c": torch.full((1,), 2.0)})  # version 3, after the newer snapshot
    store.commit(older)  # nothing superseded up to version 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.1.pt", "0.2.pt", "0.3.pt"]
    store.commit(newer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.2.pt", "0.3.pt"]
    resumed = ClientStore("disk", tmp_path)
    resumed.load_state_dict(newer)
    assert torch.equal(resumed.get(0)["c"], torch.ones(1))


def test_disk_store_reads_a_checkpoint_that_lists_its_files(tmp_path):
    """Checkpoints written before disk checkpoints named a version held an index of files."""
    torch.save({"c": torch.ones(2)}, tmp_path / "4.7.pt")
    store = ClientStore("disk", tmp_path)
    store.load_state_dict({"mode": "disk", "files": {4: "4.7.pt"}, "version": 7})
    assert torch.equal(store.get(4)["c"], torch.ones(2)) and store.client_ids() == [4]
    store.put(4, {"c": torch.zeros(2)})
    assert (tmp_path / "4.8.pt").is_file()
    with pytest.raises(ConfigurationError, match=r"\['5.1.pt'\] are missing"):
        store.load_state_dict({"mode": "disk", "files": {5: "5.1.pt"}, "version": 1})

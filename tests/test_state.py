import os
import pickle
import random
from pathlib import Path

import pytest
import torch

from fedlightning.errors import ConfigurationError, StorageError
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
    assert _versions(tmp_path) == ["0.2"]


def _versions(folder: Path) -> list[str]:
    """``client.version`` of each state file in ``folder`` (the digest and suffix left out)."""
    return sorted(".".join(p.name.split(".")[:2]) for p in folder.iterdir() if p.name[0] != ".")


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
        for owner, name in ((Path, "write_bytes"), (Path, "unlink")):
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
                store.close()  # the killed process's lock goes with it
                store, expected = _resume(path, durable)
                store.open()
            _holds(store, expected)
            fs.kill_at = -1  # the resumed run runs to its end
            _rounds(store, fs, expected, durable, rng, rounds=2)
            _holds(store, expected)
            files = _versions(path)
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
    assert _versions(tmp_path) == ["0.1", "0.2", "0.3"]
    store.commit(newer)
    assert _versions(tmp_path) == ["0.2", "0.3"]
    resumed = ClientStore("disk", tmp_path)
    resumed.load_state_dict(newer)
    assert torch.equal(resumed.get(0)["c"], torch.ones(1))


def test_a_checkpoint_whose_state_files_carry_no_content_digest_is_refused(tmp_path):
    """Checkpoints of an older fedlightning named files without a content digest: refused with
    one message, never resumed without the checks."""
    old = {"mode": "disk", "version": 7, "clients": 1, "digest": "0" * 16}
    with pytest.raises(ConfigurationError, match="older fedlightning, whose state files carry no"):
        ClientStore("disk", tmp_path).load_state_dict(old)


# -- a folder owned by one run, files that say whose they are (issue 33 item 6) -------------------
def _state_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_state_file_changed_or_swapped_is_refused_when_read(tmp_path):
    """A file carries its client's id and is named by its content digest: another client's
    content under a client's name, or another client's file given a client's place, is refused
    naming the file; never trained on."""
    store = ClientStore("disk", tmp_path)
    store.put(0, {"c": torch.zeros(2)})
    store.put(1, {"c": torch.ones(2)})
    mine, theirs = (next(tmp_path.glob(f"{c}.*.pt")) for c in (0, 1))
    original = mine.read_bytes()
    mine.write_bytes(theirs.read_bytes())  # client 1's state copied over client 0's file
    with pytest.raises(StorageError, match=rf"client 0's state file '.*{mine.name}' does not hold "
                       "what this run wrote \\(its content digest differs\\)"):  # fmt: skip
        store.get(0)
    mine.write_bytes(original)
    theirs.rename(tmp_path / f"0{theirs.name[1:]}")  # client 1's file renamed as client 0's
    disk = store._disk
    disk._live[0], disk._sums[0] = disk._live[1], disk._sums[1]  # ...and a run that looks there
    with pytest.raises(StorageError, match=r"client 0's state file '.*' holds client 1's state"):
        store.get(0)


def test_state_files_swapped_between_two_runs_folders_are_refused_at_resume(tmp_path):
    """Two runs' client 3 at the same version: the checkpoint's digest covers each file's content
    digest, so the folders, their files swapped (names and all), hold neither checkpoint."""
    checkpoints = {}
    for run, value in (("a", 0.0), ("b", 1.0)):
        store = ClientStore("disk", tmp_path / run)
        store.put(3, {"c": torch.full((2,), value)})
        checkpoints[run] = store.state_dict()
    (a,), (b,) = (list((tmp_path / run).glob("3.1.*.pt")) for run in ("a", "b"))
    a.rename(tmp_path / "b" / a.name)
    b.rename(tmp_path / "a" / b.name)
    for run in ("a", "b"):
        with pytest.raises(ConfigurationError, match="does not hold this checkpoint's client"):
            ClientStore("disk", tmp_path / run).load_state_dict(checkpoints[run])


def test_a_folder_a_live_run_holds_is_refused_naming_it(tmp_path):
    first = ClientStore("disk", tmp_path / "client_state")
    first.open()
    second = ClientStore("disk", tmp_path / "client_state")
    message = (
        rf"client state folder '.*client_state' is in use by another run \(pid {os.getpid()}\)"
    )
    with pytest.raises(ConfigurationError, match=message):
        second.check()
    with pytest.raises(ConfigurationError, match=message):
        second.open()
    first.close()  # the first run ended
    second.open()
    second.close()


def test_a_run_whose_client_state_is_a_link_to_another_runs_folder_is_refused(
    cli, tmp_path, capsys
):
    """Run B's client_state a link to run A's folder: B is refused at start-up, naming the link
    and its target, and A's state files are untouched byte for byte (B deleted them before)."""
    disk = ("--loop.client_state", "disk", "--loop.rounds", "1")
    cli(tmp_path / "a", *disk, config="scaffold_tiny.yaml")
    folder = tmp_path / "a" / "client_state"
    before = _state_files(folder)
    assert len(before) > 1  # the lock and SCAFFOLD's c_i files
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "client_state").symlink_to(folder)
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path / "b", *disk, config="scaffold_tiny.yaml")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"loop.client_state='disk' keeps client state in {str(tmp_path / 'b' / 'client_state')!r}"
        f", which is a symbolic link (to {str(folder)!r}): a run's client state folder is its "
        "own, never shared through a link" in err
    ) and "Traceback" not in err
    assert _state_files(folder) == before
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["client_state"]

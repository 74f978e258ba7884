import pytest
import torch

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

"""Uploads that do not match the payload are that client's rejection, never averaged in and never a
traceback: through ``fedlightning fit`` with plug-in objectives (tests/user_clients.py) whose
client 2 uploads int64, float64 or numpy weights for a float32 model, nested lists, a key the
payload lacks, or a SCAFFOLD ``delta_c`` of the wrong dtype, of numpy arrays or none at all. The
run goes on without that client; when every client does it, the run stops naming the reason."""

import logging
import re

import pytest
import torch

from fedlightning.loop.failures import upload_mismatch
from fedlightning.protocol import Payload, Upload

WEIGHTS = {
    "int64": r"of the wrong dtype \(features.1.weight: got torch.int64, expected torch.float32\)",
    "float64": r"of the wrong dtype \(features.1.weight: got torch.float64, expected torch.float32\)",
    "numpy": r"that are not tensors \(features.1.weight: got numpy.ndarray, expected a torch.Tensor "
    r"of torch.float32, shape \(64, 64\)\)",
    "list": r"that are not tensors \(features.1.weight: got builtins.list",
    "extra_key": r"the payload lacks \(not_in_the_payload: not among the payload's 4 keys\)",
}  # fmt: skip
EXTRAS = {
    "float64": r"uploaded an extra of the wrong dtype \(delta_c\['features.1.weight'\]: got "
    r"torch.float64, expected torch.float32\)",
    "numpy": r"uploaded an extra that are not tensors \(delta_c\['features.1.weight'\]: got numpy",
    "missing": r"uploaded no delta_c extra \(the aggregator needs it\)",
}  # fmt: skip
EVERY_CLIENT = ("--loop.clients_per_round", "8", "--loop.rounds", "2")


def _rejected_client_2(rows, caplog, reason):
    assert [int(float(r["clients_rejected"])) for r in rows] == [1, 1]
    assert float(rows[-1]["test_acc"]) > 0.5  # the seven others still train the model
    assert re.search(r"client\(s\) 2 uploaded " + reason, caplog.text), caplog.text
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("how", WEIGHTS)
def test_weights_that_do_not_match_the_payload_are_that_clients_rejection(
    cli, tmp_path, caplog, how
):
    caplog.set_level(logging.WARNING, logger="fedlightning")
    rows = cli(tmp_path, "--model", "user_clients.MismatchedUpload", "--model.upload", how,
               *EVERY_CLIENT)  # fmt: skip
    _rejected_client_2(rows, caplog, "weights " + WEIGHTS[how])
    straight = torch.load(tmp_path / "global.pt", weights_only=True)
    assert all(v.dtype == torch.float32 for k, v in straight.items() if "weight" in k)


@pytest.mark.parametrize("how", EXTRAS)
def test_extras_that_do_not_match_are_that_clients_rejection(cli, tmp_path, caplog, how):
    caplog.set_level(logging.WARNING, logger="fedlightning")
    rows = cli(tmp_path, "--model", "user_clients.MismatchedExtra", "--model.extra", how,
               *EVERY_CLIENT, config="scaffold_tiny.yaml")  # fmt: skip
    _rejected_client_2(rows, caplog, EXTRAS[how][len("uploaded ") :])


def test_when_every_client_uploads_a_mismatch_the_run_stops_naming_it(cli, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path, "--model", "user_clients.MismatchedUpload", "--model.upload", "int64",
            "--model.bad_client", "-1", *EVERY_CLIENT)  # fmt: skip
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "round 1: no client succeeded (0 raised, 8 uploads rejected)" in err
    assert re.search(
        r"every upload was rejected; client \d uploaded weights " + WEIGHTS["int64"], err
    )


def test_a_client_may_upload_fewer_keys_and_float64_where_the_fit_is_64_true():
    payload = Payload({"w": torch.zeros(2, 3), "b": torch.zeros(3), "n": torch.tensor(0)})
    upload = Upload(0, {"w": torch.ones(2, 3, dtype=torch.float64), "n": torch.tensor(4)}, 5, 1)
    assert upload_mismatch(upload, payload, fit_dtype=torch.float64) == ""
    assert "wrong dtype (w: got torch.float64" in upload_mismatch(upload, payload)
    upload.weights["n"] = torch.tensor(4, dtype=torch.int32)  # integer buffers keep their dtype
    assert "wrong dtype (n: got torch.int32, expected torch.int64)" in upload_mismatch(
        upload, payload, fit_dtype=torch.float64
    )
    mask = Upload(0, {"w": torch.ones(2, 3)}, 5, 1, extras={"mask": {"w": torch.ones(2, 3) > 0}})
    assert upload_mismatch(mask, payload) == ""  # a bool extra keyed like the model: its own dtype
    mask.extras["mask"]["w"] = torch.ones(3) > 0
    assert "extra of the wrong shape (mask['w']: got (3,), expected (2, 3))" in upload_mismatch(
        mask, payload
    )

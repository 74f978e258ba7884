"""Without the privacy extra (Opacus, dp-accounting), each differential-privacy option is a
configuration error (exit 2) of one line naming the extra, before anything is trained or written.
The missing package is simulated (``sys.modules["opacus"] = None`` makes ``import opacus`` raise
ImportError), so the test runs whether or not Opacus is installed."""

import re
import sys

import pytest

from conftest import run_cli

CLIENT_LEVEL = [
    "--loop.client_sampling", "poisson", "--loop.aggregator", "fedlightning.privacy.ClientLevelDP",
    "--loop.aggregator.init_args.noise_multiplier", "1.0",
]  # fmt: skip
DP_SGD = ["--loop.dp_sgd", "fedlightning.privacy.DPSGD"]


@pytest.mark.parametrize("args", [CLIENT_LEVEL, DP_SGD], ids=["client-level", "dp-sgd"])
def test_without_opacus_each_feature_is_one_line_naming_the_extra(
    tmp_path, capsys, monkeypatch, args
):
    monkeypatch.setitem(sys.modules, "opacus", None)  # import opacus raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path / "run", *args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(
        r"^fedlightning: error: .* needs Opacus: pip install 'fedlightning\[privacy\]'$", err, re.M
    )
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args", [CLIENT_LEVEL, DP_SGD], ids=["client-level", "dp-sgd"])
def test_without_dp_accounting_the_default_accountant_is_one_line_naming_the_extra(
    tmp_path, capsys, monkeypatch, args
):
    """The default accountant (pld) is dp-accounting's: without it, one line naming the extra."""
    pytest.importorskip("opacus")
    monkeypatch.setitem(sys.modules, "dp_accounting", None)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path / "run", *args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(
        r"^fedlightning: error: .*accountant='pld' needs Google's dp-accounting: "
        r"pip install 'fedlightning\[privacy\]'$", err, re.M,
    )  # fmt: skip
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()

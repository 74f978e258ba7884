"""Every shipped configuration learns: each config under ``configs/`` (``configs/experiments/``
need data sets on disk) runs at its defaults, in a process of its own on one torch thread under
the pinned CPU kernel family (two such processes at a time: the CI machine's two cores), and ends
at the figure its header's ``# Checked:`` line states (:mod:`checked_headers`)::

    # Checked: test_acc 0.9611 ± 0.04 after round 30 (pinned kernels, one thread; ± on other CPUs)
    # Checked: group_mean_acc to be re-measured (...)    no figure yet: skipped, saying why

Under the stated settings (this suite's: tests/pinned_kernels.py, one thread) a run gives the same
bits on every x86-64 machine with AVX2, so the figure is checked to 4 decimals there; on a CPU
whose kernels the pin cannot fix (another architecture) it is checked within the stated
tolerance. ``python tests/checked_headers.py`` re-measures every header and rewrites it.

Every logged accuracy is the saved models scored in eval mode (docs/algorithms.md section 6.1;
tests/test_rescore.py re-scores every config's models independently, on both backends). CoFED
configs run through ``fedlightning cofed`` and check summary.json. Each test prints its value and
its process's CPU time (``pytest -s``): the headers' CPU times come from here.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from checked_headers import (
    CONFIGS,
    MAX_TOLERANCE,
    MIN_TOLERANCE,
    PENDING,
    SETTINGS,
    Claim,
    command,
    evaluations,
    label,
    main,
    rewrite,
    stated,
    timed,
    tolerance,
)
from pinned_kernels import CAPABILITY

#: the pinned kernel family is in force (an x86-64 CPU with AVX2): figures hold to 4 decimals
PINNED = torch.backends.cpu.get_cpu_capability() == CAPABILITY


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The selected configs' runs, each on one thread: ``runs(config) -> (run_dir, status,
    stderr, CPU seconds)``. Where this process runs the whole module, two at a time (the machine's
    two cores), each started when the test before it starts; where xdist hands the tests out one
    by one (``--dist loadgroup``, CI's slow stage: xdist sets ``loadgroup`` on its workers), one
    at a time, its own: the next config may be another process's, and the processes are the
    parallelism."""
    whole_module = not getattr(request.config.option, "loadgroup", False)
    selected = [
        item.callspec.params["config"] for item in request.session.items
        if item.originalname == "test_config_reaches_its_stated_accuracy"
        and Claim.of(item.callspec.params["config"]).value is not None
    ]  # fmt: skip
    root = tmp_path_factory.mktemp("configs")
    pool = ThreadPoolExecutor(max_workers=2)
    futures: dict[Path, Any] = {}

    def submit(config: Path) -> None:
        if config not in futures:
            run_dir = root / label(config).replace("/", "_")
            futures[config] = (run_dir, pool.submit(timed, config, run_dir))

    def get(config: Path) -> tuple[Path, int, str, float]:
        submit(config)
        index = selected.index(config) if config in selected else -1
        if whole_module and 0 <= index < len(selected) - 1:
            submit(selected[index + 1])  # the next runs beside this one
        run_dir, future = futures[config]
        return (run_dir, *future.result())

    yield get
    pool.shutdown(wait=True, cancel_futures=True)


def test_every_config_states_one_claim():
    for config in CONFIGS:
        claim = Claim.of(config)
        if claim.value is not None:
            assert 0 < claim.value <= 1, config.name
            assert MIN_TOLERANCE <= claim.tolerance <= MAX_TOLERANCE, config.name
            assert claim.note == stated(config), (
                f"{config.name}: '# Checked: {claim.metric} {claim.value} ± {claim.tolerance} "
                f"{claim.note}' does not state '{stated(config)}': re-measure it with python "
                f"tests/checked_headers.py {label(config)}"
            )


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=[label(c) for c in CONFIGS])
def test_config_reaches_its_stated_accuracy(config, runs):
    claim = Claim.of(config)
    if claim.value is None:
        pytest.skip(f"{claim.metric} {PENDING}: {claim.note}")
    run_dir, status, err, seconds = runs(config)
    assert status == 0, f"{' '.join(command(config, run_dir))} exited {status}: {err[-2000:]}"
    measured = evaluations(config, run_dir, claim.metric)[-1]
    print(f"{label(config)}: {claim.metric} {measured:.4f} in {seconds:.0f} CPU-s")
    backend = next((line for line in err.splitlines() if line.startswith("backend:")), "")
    if PINNED:
        assert claim.exact(measured), (
            f"{claim.metric} {measured:.4f}, header: {claim.value:.4f} under the pinned kernels "
            f"and one thread ({backend or 'no backend line'}); re-measure: python "
            f"tests/checked_headers.py {label(config)}"
        )
    else:
        assert claim.holds(measured), (
            f"{claim.metric} {measured:.4f}, header: {claim.value} ± {claim.tolerance} (kernels "
            f"{torch.backends.cpu.get_cpu_capability()}: not the pinned family)"
        )


def test_recording_rewrites_the_header_with_the_figure_and_the_settings(tmp_path):
    """``python tests/checked_headers.py`` writes what the test reads back: the figure to 4
    decimals, a tolerance from the run's last five evaluations, the settings."""
    config = tmp_path / "fedavg.yaml"
    original = (CONFIGS[0].parent / "fedavg.yaml").read_text()
    config.write_text(original)
    # last five: mean 0.912, squared deviations sum 6.8e-4, sample std 0.01304: twice, up: 0.03
    swing = [0.5, 0.90, 0.92, 0.91, 0.93, 0.90]
    assert tolerance(swing, 0.05) == 0.03
    assert tolerance([0.9] * 6, 0.05) == MIN_TOLERANCE and tolerance([0.1, 0.9] * 3, 0.05) == 0.1
    assert tolerance([0.8449], 0.02) == 0.02  # CoFED's one value: the stated tolerance
    rewrite(config, "test_acc", 0.91234, 0.03)
    claim = Claim.of(config)
    assert (claim.metric, claim.value, claim.tolerance) == ("test_acc", 0.9123, 0.03)
    assert claim.note == f"after round 30 ({SETTINGS})"
    assert claim.exact(0.91234) and not claim.exact(0.91236) and claim.holds(0.94)
    lines = zip(original.splitlines(), config.read_text().splitlines(), strict=True)
    changed = [a for a, b in lines if a != b]
    assert len(changed) == 1 and changed[0].startswith("# Checked: test_acc")


def test_recording_refuses_an_unknown_config_before_running_anything(capsys):
    """``python tests/checked_headers.py NAME`` names the config it cannot find, in one line."""
    with pytest.raises(SystemExit) as stop:
        main(["fedavg", "no_such_config"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2
    assert err[-1].endswith(f"no such config: {CONFIGS[0].parent / 'no_such_config.yaml'}")

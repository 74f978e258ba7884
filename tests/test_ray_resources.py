"""A Ray request that can never be scheduled fails within seconds naming the resource, leaves no
Ray instance (and no idle workers) behind, and writes nothing."""

import time

import pytest

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # starts a local Ray instance (tens of seconds here)


@pytest.mark.parametrize(
    ("option", "value", "resource"),
    [("num_gpus_per_client", "1", "GPU"), ("num_cpus_per_client", "64", "CPU")],
)
def test_an_unschedulable_ray_request_fails_fast_naming_the_resource(
    cli, tmp_path, capsys, option, value, resource, without_ray
):
    if resource == "GPU" and __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    started = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path / "run", "--loop.backend", "RayBackend", f"--loop.backend.{option}", value,
            "--loop.accelerator", "cpu")  # fmt: skip
    assert exit_info.value.code == 2
    assert time.monotonic() - started < 120  # Ray's start-up; without the check it waits forever
    err = capsys.readouterr().err
    assert f"loop.backend.init_args.{option}={value} can never be scheduled" in err, err
    assert f"{resource}(s) in all" in err
    assert not ray.is_initialized()  # shut down again: no ray::IDLE workers left behind
    assert not (tmp_path / "run").exists()

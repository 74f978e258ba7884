"""``fedlightning test RUN_DIR`` compares its scores with metrics.csv within a tolerance and always
prints the largest difference; a value it calls different never prints like the logged one
(issue 42 item 6)."""

import math

from fedlightning.cli.scoring import TOLERANCE, compare_logged

LOGGED = {"round": 15.0, "test_acc": 0.8306, "test_loss": 0.52341234, "resnet10/test_acc": 0.5}


def test_float_noise_is_the_same_numbers_with_the_largest_difference():
    now = {"test_acc": 0.8306, "test_loss": 0.52341234 + 3e-8, "resnet10/test_acc": 0.5}
    line = compare_logged(now, LOGGED)
    assert line == (
        "metrics.csv round 15: the same numbers (largest difference 3e-08 (test_loss), "
        "tolerance 1e-06)"
    )


def test_a_difference_beyond_the_tolerance_prints_both_values_apart():
    now = {"test_acc": 0.8306, "test_loss": 0.52341234 + 4e-6, "resnet10/test_acc": 0.4375}
    line = compare_logged(now, LOGGED)
    assert line == (
        "metrics.csv round 15 logged otherwise: test_loss 0.52341 (now 0.52342), "
        "resnet10/test_acc 0.5000 (now 0.4375); largest difference 0.062 (resnet10/test_acc), "
        "tolerance 1e-06"
    )
    for part in line.split(": ", 1)[1].split("; ")[0].split(", "):
        logged, now_value = part.split(" ", 1)[1].split(" (now ")
        assert logged != now_value.rstrip(")")  # never "logged otherwise" for equal prints


def test_a_large_loss_is_compared_relatively_and_nan_against_nan_agrees():
    logged = {"round": 1.0, "test_loss": 21.8, "test_acc": math.nan}
    now = {"test_loss": 21.8 * (1 + TOLERANCE / 2), "test_acc": math.nan}
    assert compare_logged(now, logged).startswith("metrics.csv round 1: the same numbers")
    now["test_acc"] = 0.1
    assert compare_logged(now, logged).startswith(
        "metrics.csv round 1 logged otherwise: test_acc nan (now 0.1000); largest difference inf"
    )

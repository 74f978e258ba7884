"""fedlightning.gc_tuning: the collector is paused only while fedlightning imports, nothing stays
frozen for a library user, and only the ``fedlightning`` process freezes its imports."""

import gc
import subprocess
import sys
from pathlib import Path

from fedlightning.gc_tuning import gc_paused

ROOT = Path(__file__).parents[1]


def fresh_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    return done.stdout.strip()


def test_gc_paused_restores_the_collector_and_moves_the_block_to_the_oldest_generation():
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    with gc_paused():
        assert not gc.isenabled()
        made = [[i] for i in range(1000)]  # tracked containers
    assert gc.isenabled() and gc.get_freeze_count() == frozen_before
    if frozen_before == 0:  # in the oldest generation: the young ones hold none of them
        young = {id(o) for generation in (0, 1) for o in gc.get_objects(generation)}
        assert not young & {id(m) for m in made}
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a disabled collector stays disabled
    finally:
        gc.enable()


def _tracked(obj: object) -> bool:
    """Whether ``obj`` is in a collected generation (not frozen: ``gc.get_objects`` leaves out
    the permanent one)."""
    return any(o is obj for o in gc.get_objects())


def test_gc_paused_leaves_objects_frozen_by_the_caller_frozen():
    """Checked on the objects themselves, not on ``gc.get_freeze_count()``: that count falls
    whenever any frozen object is freed, by another thread of the test process too."""
    callers = [["frozen by the caller"]]
    gc.freeze()
    try:
        with gc_paused():
            made = [[i] for i in range(100)]
        assert not _tracked(callers) and not _tracked(callers[0])  # still frozen
        assert _tracked(made)  # and the block's objects were not frozen with them
    finally:
        gc.unfreeze()


def test_importing_fedlightning_leaves_the_collector_as_it_was():
    out = fresh_python(
        "import gc, fedlightning, fedlightning.cli\nprint(gc.isenabled(), gc.get_freeze_count())"
    )
    assert out == "True 0"


def test_only_the_fedlightning_process_freezes_its_imports():
    """A subcommand's imports (``plot``'s here) are frozen in the ``fedlightning`` process only
    (``--version`` and ``--help`` import nothing worth freezing)."""
    out = fresh_python(
        "import gc, sys\n"
        "from fedlightning.cli import main\n"
        "for args in (['plot', '--help'], None):\n"
        "    sys.argv = ['fedlightning', 'plot', '--help']\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    print(gc.get_freeze_count() > 0)\n"
    )
    assert [line for line in out.splitlines() if line in ("True", "False")] == ["False", "True"]

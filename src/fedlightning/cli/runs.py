"""``fedlightning fit ... --fast_dev_run`` (a smoke test) and ``fedlightning fit ... --seeds 0 1 2``
(one run per seed, then mean ± std).

``--fast_dev_run`` runs the config as Lightning's ``fast_dev_run`` runs a Trainer: one round of the
configured clients, each :data:`FAST_DEV_RUN_STEPS` optimizer steps (batches) instead of its
epochs, through aggregation, evaluation, the checkpoint and the plots, in a temporary directory
that is deleted at the end, with no logger (``loop.loggers``, W&B) attached: nothing is written
that could be mistaken for a result, and the accuracy it prints after one short round is not one.
It answers "does this config run?" in seconds.

``--seeds S [S ...]`` runs the config once per seed (``loop.seed`` = S, which also seeds the model's
initialisation and the partition) into ``<run_dir>/seed_<S>``, then prints one line with the
mean ± sample standard deviation (ddof 1) of the last evaluated headline over the seeds (a
single seed prints its value alone), and draws ``<run_dir>/seeds.png`` (the mean with a band of
± one standard deviation per round, :func:`fedlightning.analysis.plots.plot_runs`, titled as
``fedlightning plot`` titles, over the seeds) unless ``loop.plots`` is false. The headline is
``test_acc``, or ``group_mean_acc`` for a config with client groups, followed by each group's
model's mean ± std (:mod:`fedlightning.loop.headline`). The seeds run one after another, each with the config's backend; with
``RayBackend`` they run in parallel as Ray tasks instead (each holding the backend's
``num_cpus_per_client`` and ``num_gpus_per_client``), each seed's clients fitting one after another
inside its task (``SequentialBackend``, which gives RayBackend's results bit for bit), so a cluster
runs as many seeds at once as it has room for. The statistics and the smoke test's decisions:
docs/algorithms.md section 6.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fedlightning.backends.ray import RayBackend, init_ray
from fedlightning.cli.fit import fit_command
from fedlightning.cli.seeds import Sweep, check_sweep
from fedlightning.errors import ConfigurationError, RunInterrupted
from fedlightning.loop.headline import UNGROUPED, ScoredModels, headline, headline_metric
from fedlightning.signals import finished, more_work, stopped_by

#: optimizer steps (batches) per client fit in a fast_dev_run
FAST_DEV_RUN_STEPS = 2
#: the options a fast_dev_run sets (after the user's, so they win)
FAST_DEV_RUN = [
    "--loop.rounds", "1", "--loop.local_steps", str(FAST_DEV_RUN_STEPS),
    "--loop.loggers", "null", "--loop.wandb", "false",
]  # fmt: skip
#: the metric the seeds' summary line averages (a run with client groups: group_mean_acc)
SUMMARY_METRIC = "test_acc"


@dataclass
class RunOptions:
    """``fedlightning fit``'s arguments with ``--seeds`` and ``--fast_dev_run`` taken out."""

    args: list[str]
    seeds: list[int] | None = None
    fast_dev_run: bool = False

    @property
    def plain(self) -> bool:
        """Neither option was given: a plain ``fit``."""
        return self.seeds is None and not self.fast_dev_run


@dataclass
class SeedRun:
    """One seed's run: its directory, its last evaluated metrics and what its evaluation scores
    (its client groups)."""

    seed: int
    run_dir: str
    metrics: dict[str, float] = field(default_factory=dict)
    scored: ScoredModels = UNGROUPED

    @property
    def metric(self) -> str:
        """The metric this run headlines (``test_acc`` or ``group_mean_acc``)."""
        return headline_metric(self.metrics, self.scored)


def run_options(argv: list[str]) -> RunOptions:
    """Take ``--seeds S [S ...]`` and ``--fast_dev_run`` out of ``argv`` (``fit`` and its
    arguments); refuse what they cannot be combined with."""
    options = RunOptions(args=[])
    i = 0
    while i < len(argv):
        if argv[i] == "--fast_dev_run":
            options.fast_dev_run = True
        elif argv[i] == "--seeds":
            end = i + 1
            while end < len(argv) and not argv[end].startswith("--"):
                end += 1
            options.seeds = _seeds(argv[i + 1 : end])
            i = end - 1
        else:
            options.args.append(argv[i])
        i += 1
    given = {word.split("=", 1)[0] for word in options.args}
    if options.fast_dev_run and (options.seeds is not None or "--ckpt_path" in given):
        raise ConfigurationError(
            "--fast_dev_run is a run of its own: it takes no --seeds and no --ckpt_path"
        )
    if options.seeds is not None and given & {"--ckpt_path", "--loop.seed"}:
        raise ConfigurationError(
            "--seeds starts one run per seed: it takes no --loop.seed and no --ckpt_path "
            "(resume one seed's run on its own: --loop.seed S --loop.run_dir RUN_DIR/seed_S "
            "--ckpt_path RUN_DIR/seed_S/last.ckpt)"
        )
    return options


def _seeds(values: list[str]) -> list[int]:
    try:
        seeds = [int(value) for value in values]
    except ValueError:
        raise ConfigurationError(f"--seeds takes integers, got {' '.join(values)!r}") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ConfigurationError(
            f"--seeds takes distinct integers >= 0 (--seeds 0 1 2), got {values}"
        )
    return seeds


def run(options: RunOptions) -> None:
    """Run ``fedlightning fit`` with ``options`` (not :attr:`RunOptions.plain`)."""
    if options.fast_dev_run:
        fast_dev_run(options.args)
    else:
        run_seeds(options.args, options.seeds or [])


def fast_dev_run(args: list[str]) -> None:
    """The smoke test of the module docstring; ``args``: ``fit`` and its arguments."""
    with tempfile.TemporaryDirectory(prefix="fedlightning-fast_dev_run-") as scratch:
        try:
            fit_command([*args, *FAST_DEV_RUN, "--loop.run_dir", f"{scratch}/run"])
        except RunInterrupted as stop:  # nothing to resume: the directory goes with the run
            message = f"fast_dev_run {stopped_by(stop.signum)}: nothing was kept"
            raise RunInterrupted(message, stop.signum) from None
    print(
        f"fast_dev_run passed: one round of client fits of {FAST_DEV_RUN_STEPS} batches, "
        "aggregation, evaluation, checkpoint and plots ran; its numbers are no result, and "
        f"{scratch} is deleted: nothing was kept"
    )


def run_seeds(args: list[str], seeds: list[int]) -> None:
    """The seeds of the module docstring; ``args``: ``fit`` and its arguments. Every seed's
    options and run directory are checked before the first seed trains, a failing seed is
    named, and SIGINT/SIGTERM stop the sweep at any seed (:mod:`fedlightning.cli.seeds`)."""
    sweep = Sweep(args, seeds)
    with sweep.reporting():
        plan = check_sweep(args, seeds, sweep)
        sweep.began = True
        if plan.ray is not None:
            runs = _seeds_on_ray(args, seeds, plan.ray, sweep)
        else:
            runs = []
            for seed in seeds:
                if runs:
                    more_work()  # the last seed finished: a signal stops the sweep again
                with sweep.running_seeds(seed):
                    runs.append(run_seed(args, seed))
                sweep.finished.append(seed)
    finished()  # every seed's files are complete: a signal changes nothing from now on
    print(summary_line(runs))
    if plan.plots:
        from fedlightning.analysis.plots import default_title, plot_runs

        listed = ", ".join(str(run.seed) for run in runs)
        run_dirs = [Path(run.run_dir) for run in runs]  # titled as `fedlightning plot` titles
        title = default_title(run_dirs, len(runs) > 1, over=f"seeds {listed}")
        out = plot_runs(
            run_dirs, _metric(runs), plan.base / "seeds.png", "loop.aggregator", title=title
        )
        print(f"wrote {out}")


def run_seed(args: list[str], seed: int) -> SeedRun:
    """``fedlightning fit`` with ``loop.seed`` = ``seed`` into ``<run_dir>/seed_<seed>`` (also a
    Ray task: it runs in a worker process)."""
    cli = fit_command([*args, "--loop.seed", str(seed)], subdirectory=f"seed_{seed}")
    history, scored = cli.trainer.history, cli.trainer.reporter.scored
    run_dir = str(cli.trainer.options.run_dir)
    return SeedRun(seed, run_dir, dict(history[-1]) if history else {}, scored)


def _seeds_on_ray(
    args: list[str], seeds: list[int], backend: RayBackend, sweep: Sweep
) -> list[SeedRun]:
    """Each seed a Ray task, its clients fitting sequentially inside it (module docstring)."""
    owns = init_ray(backend.address)  # without Ray: one line, as a run on RayBackend says
    import ray

    task = ray.remote(num_cpus=backend.num_cpus, num_gpus=backend.num_gpus)(run_seed)
    sequential = [*args, "--loop.backend", "SequentialBackend"]
    pending = {task.remote(sequential, seed): seed for seed in seeds}
    sweep.running = list(seeds)
    runs: dict[int, SeedRun] = {}
    try:
        while pending:
            (ready,), _ = ray.wait(list(pending), num_returns=1)
            seed = pending.pop(ready)
            try:
                runs[seed] = ray.get(ready)
            except ray.exceptions.RayTaskError as error:
                sweep.running = [seed]  # the failure is this seed's
                raise error.as_instanceof_cause() from None
            sweep.running.remove(seed)
            sweep.finished.append(seed)
            print(f"seed {seed}: {_value(runs[seed])}; run directory {runs[seed].run_dir}")
    finally:
        for ref in pending:  # a failed seed stops the others
            ray.cancel(ref, force=True)
        if owns:
            ray.shutdown()
    return [runs[seed] for seed in seeds]


def summary_line(runs: list[SeedRun]) -> str:
    """``seeds 0, 1, 2: test_acc 0.9311 ± 0.0042 (...)``, with client groups
    ``group_mean_acc 0.7044 ± 0.0100 (...; resnet10 0.8306 ± 0.0050, ...)``; one seed: its
    value alone."""
    listed = ", ".join(str(run.seed) for run in runs)
    metric = _metric(runs)
    values = [run.metrics[metric] for run in runs if metric in run.metrics]
    where = f"{Path(runs[0].run_dir).parent}/seed_*" if len(runs) > 1 else runs[0].run_dir
    rounds = sorted({int(run.metrics.get("round", 0)) for run in runs})
    at = f"round {rounds[0]}" if len(rounds) == 1 else f"rounds {rounds[0]}-{rounds[-1]}"
    if len(runs) == 1:
        return f"seed {listed}: {_value(runs[0])} at {at} (one seed: no spread); {where}"
    if len(values) < len(runs):
        return f"seeds {listed}: not every run evaluated {metric}; {where}"
    groups = (
        "".join(f", {each}" for each in _group_spreads(runs)) if metric != SUMMARY_METRIC else ""
    )
    return (
        f"seeds {listed}: {metric} {_spread(values)} (mean ± sample std over "
        f"{len(values)} runs at {at}{groups}); {where}"
    )


def _metric(runs: list[SeedRun]) -> str:
    """The seeds' headline: ``group_mean_acc`` when every run headlines it, else ``test_acc``."""
    metrics = {run.metric for run in runs}
    return metrics.pop() if len(metrics) == 1 else SUMMARY_METRIC


def _spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def _group_spreads(runs: list[SeedRun]) -> list[str]:
    """``resnet10 0.8306 ± 0.0050`` for each group model every run scored."""
    keys = [f"{group}/test_acc" for group in runs[0].scored.groups]
    return [
        f"{key.split('/')[0]} {_spread([run.metrics[key] for run in runs])}"
        for key in keys
        if all(key in run.metrics for run in runs)
    ]


def _value(run: SeedRun) -> str:
    text = headline(run.metrics, run.scored)
    return text if text else f"no {run.metric}"

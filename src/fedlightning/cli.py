"""``fedlightning fit --config configs/quickstart.yaml``: a LightningCLI whose trainer is the FederatedLoop.

The config has three groups: ``loop`` (FederatedLoop, with its ``aggregator``), ``model`` (a
ClientModule subclass: the client objective) and ``data`` (FederatedDataModule). The model's input
and output sizes are linked from the data, and the loop's seed seeds model initialisation and the
data partition, so one ``loop.seed`` fixes the whole run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fedlightning.gc_tuning import freeze_imported, gc_paused

with gc_paused():  # see fedlightning.gc_tuning
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

    from fedlightning.cli_errors import check_config_files, one_line_error, stop_report
    from fedlightning.cli_help import PlainHelpFormatter, print_fit_usage, print_overview, version
    from fedlightning.clients.base import ClientModule
    from fedlightning.data.datamodule import FederatedDataModule
    from fedlightning.errors import ConfigurationError, RunStopped, StorageError
    from fedlightning.loop import ClientBug, FederatedLoop
    from fedlightning.signals import StopSignal, stop_on_signals

#: the model's sizes, linked from the data module
LINKED_SIZES = ("num_classes", "in_channels", "image_size")


class FederatedCLI(LightningCLI):
    """LightningCLI with the trainer group named ``loop`` and a single seed (``loop.seed``).

    ``grid``: the Flower Grid of the ServerApp running this command
    (:mod:`fedlightning.flower_app.server`), handed to its ``FlowerBackend(address=None)``.
    """

    def __init__(
        self, args: Any = None, print_config: bool = False, grid: Any = None, **kwargs: Any
    ) -> None:
        self.print_resolved_config = print_config
        self.grid = grid
        readable = {"formatter_class": PlainHelpFormatter}
        kwargs.setdefault(
            "parser_kwargs",
            {"prog": "fedlightning", **readable, "fit": {"prog": "fedlightning fit", **readable}},
        )
        kwargs.setdefault("model_class", ClientModule)
        kwargs.setdefault("datamodule_class", FederatedDataModule)
        kwargs.setdefault("subclass_mode_model", True)
        super().__init__(
            trainer_class=FederatedLoop,
            save_config_callback=None,
            seed_everything_default=False,
            auto_configure_optimizers=False,
            args=args,
            **kwargs,
        )

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"}}

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse, then check ``--ckpt_path`` (LightningCLI reads the file next, and a truncated or
        garbage file must be a one-line error, not its traceback)."""
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path:
            from fedlightning.loop.checkpoint import read_checkpoint

            read_checkpoint(ckpt_path)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """No ``seed_everything``: ``loop.seed`` is the one seed (applied before instantiation)."""

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # the loop is instantiated by `instantiate_trainer`, like LightningCLI's Trainer
        parser.add_class_arguments(
            self.trainer_class, "loop", instantiate=False, fail_untyped=False, sub_configs=True
        )
        parser.add_lightning_class_args(
            self._model_class, "model", subclass_mode=self.subclass_mode_model
        )
        parser.add_lightning_class_args(
            self._datamodule_class, "data", subclass_mode=self.subclass_mode_data
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("loop.seed", "data.seed")
        for attribute in LINKED_SIZES:
            parser.link_arguments(
                "data",
                f"model.init_args.{attribute}",
                compute_fn=_attribute(attribute),
                apply_on="instantiate",
            )

    def _set_seed(self) -> None:
        from lightning.fabric.utilities.seed import seed_everything

        from fedlightning.loop.checks import check_seed

        check_seed(self._get(self.config, "loop").seed)  # Lightning would replace a bad one
        seed_everything(self._get(self.config, "loop").seed, verbose=False)

    def before_instantiate_classes(self) -> None:
        loop = self._get(self.config, "loop")
        if loop.run_dir is None:
            configs = self._get(self.config, "config") or []
            stem = Path(str(configs[-1])).stem if configs else "run"
            loop.run_dir = str(Path("runs") / stem)
        from fedlightning.loop.logger_outputs import name_tensorboard_runs

        name_tensorboard_runs(loop.loggers, loop.run_dir)  # a resume continues its TensorBoard run

    def instantiate_trainer(self, **kwargs: Any) -> FederatedLoop:
        config = {**self._get(self.config_init, "loop", default={}), **kwargs}
        loop = self.trainer_class(**config)
        if self.grid is not None:
            loop.backend.use_grid(self.grid)
        return loop

    def instantiate_classes(self) -> None:
        """As LightningCLI; with ``--print_config``, print the config as it will run and exit: the
        links (``data.seed``, the model's ``num_classes``/``in_channels``/``image_size``, which
        need the data) and ``run_dir`` resolved. Without the data on disk the linked sizes are
        left out with a note saying why."""
        if not self.print_resolved_config:
            super().instantiate_classes()
            return
        note = ""
        try:
            super().instantiate_classes()
        except Exception as err:
            cause = _configuration_error(err)
            if cause is None:
                raise
            note = f"# model sizes are linked from the data, which could not be read: {cause}\n"
        print(self.resolved_config() + note, end="")
        raise SystemExit(0)

    def resolved_config(self) -> str:
        """The config as YAML with every default, link target and ``run_dir`` filled in (the
        model's sizes are read from the instantiated data module: jsonargparse applies those links
        to the objects only, so the parsed config still holds the defaults)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        datamodule = getattr(self, "datamodule", None)
        if datamodule is not None:
            config = config.clone()
            for attribute in LINKED_SIZES:
                config[f"model.init_args.{attribute}"] = getattr(datamodule, attribute)
        return self._parser(self.subcommand).dump(config, skip_none=False, skip_link_targets=False)

    def before_fit(self) -> None:
        """Hand the resolved config to the loop, which writes ``<run_dir>/config.yaml`` once every
        start-up check passed (a refused run writes nothing)."""
        self.trainer.config_text = self.resolved_config()


def _attribute(name: str):
    def get(datamodule: FederatedDataModule) -> Any:
        return getattr(datamodule, name)

    return get


def main(args: list[str] | None = None, grid: Any = None) -> None:
    """Entry point of the ``fedlightning`` command; ``fedlightning plot ...`` overlays runs
    (:func:`fedlightning.analysis.plots.plot_command`); ``fedlightning cofed ...`` runs CoFED's one-shot
    pipeline (:mod:`fedlightning.cofed.cli`), which has no rounds and so no FederatedLoop;
    ``fedlightning flower-app ...`` writes a Flower App (:mod:`fedlightning.flower_app.export`);
    ``fedlightning test RUN_DIR`` scores a run's saved models (:mod:`fedlightning.cli_scoring`).
    ``grid``: a Flower ServerApp's Grid for ``fit`` with ``FlowerBackend(address=None)``
    (:mod:`fedlightning.flower_app.server`)."""
    if args is None:  # the `fedlightning` process itself (not a call from Python, e.g. a test)
        freeze_imported()  # its imports live as long as it does (fedlightning.gc_tuning)
    argv = sys.argv[1:] if args is None else list(args)
    if not argv or argv[0] in ("-h", "--help"):
        print_overview()
        raise SystemExit(0 if argv else 2)
    if argv[0] == "--version":
        print(f"fedlightning {version()}")
        raise SystemExit(0)
    if argv == ["fit"]:
        print_fit_usage()
        raise SystemExit(2)
    try:
        check_config_files(argv)  # a config that is not UTF-8 text: one line, not a traceback
        with stop_on_signals():  # SIGINT and SIGTERM alike, from start-up on
            _dispatch(argv, args, grid)
    except (RunStopped, ClientBug) as err:
        print(f"fedlightning: stopped: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except StorageError as err:
        print(f"fedlightning: storage error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except (KeyboardInterrupt, StopSignal) as stop:
        lines, status = stop_report(stop, argv)
        for line in lines:
            print(f"fedlightning: {line}", file=sys.stderr)
        raise SystemExit(status) from None
    except Exception as err:
        cause = _configuration_error(err) or one_line_error(err)
        if cause is None:
            raise
        print(f"fedlightning: error: {cause}", file=sys.stderr)
        raise SystemExit(2) from None


def _dispatch(argv: list[str], args: list[str] | None, grid: Any) -> None:
    if argv[:1] == ["plot"]:
        from fedlightning.analysis.plot_command import plot_command

        plot_command(argv[1:])
    elif argv[:1] == ["cofed"]:
        from fedlightning.cofed.cli import main as cofed_main

        cofed_main(argv[1:])
    elif argv[:1] == ["fit"] and "--print_config" in argv:  # with =flags: jsonargparse's
        rest = [a for a in argv if a != "--print_config"]
        sys.argv = sys.argv[:1]  # the arguments are `rest` (LightningCLI warns about both)
        FederatedCLI(args=rest, print_config=True)
    elif argv[:1] == ["test"]:
        from fedlightning.cli_scoring import test_command

        test_command(argv[1:])
    elif argv[:1] == ["flower-app"]:
        from fedlightning.flower_app.export import main as flower_app_main

        flower_app_main(argv[1:])
    else:
        FederatedCLI(args=args, grid=grid)


def _configuration_error(err: BaseException | None) -> ConfigurationError | None:
    """The ConfigurationError behind ``err`` (jsonargparse wraps errors raised while instantiating)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, ConfigurationError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


if __name__ == "__main__":
    main()

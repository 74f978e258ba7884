"""``fedlightning fit``: a LightningCLI whose trainer is the FederatedLoop.

The config has three groups: ``loop`` (FederatedLoop, with its ``aggregator``), ``model`` (a
ClientModule subclass: the client objective) and ``data`` (FederatedDataModule). The model's input
and output sizes are linked from the data, and the loop's seed seeds model initialisation and the
data partition, so one ``loop.seed`` fixes the whole run. A command-line or config mistake the
parser finds is one line (:func:`fedlightning.cli.names.parse_error_line`), not the usage and
jsonargparse's report. :mod:`fedlightning.cli` imports this module only for ``fit`` (it imports
Lightning).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from argparse import ArgumentError
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from fedlightning.cli.catalog import KINDS
from fedlightning.cli.errors import configuration_error
from fedlightning.cli.help import FIT_EPILOG, PlainHelpFormatter
from fedlightning.cli.names import parse_error_line
from fedlightning.clients.base import ClientModule
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.determinism import prepare_environment
from fedlightning.errors import ConfigurationError, RunStopped
from fedlightning.gc_tuning import gc_paused
from fedlightning.loop import ClientBug, FederatedLoop
from fedlightning.run_config import plain

#: the model's sizes, linked from the data module
LINKED_SIZES = ("num_classes", "in_channels", "image_size")
#: the start of LightningCLI's warning that ``args`` and ``sys.argv`` both hold arguments
ARGS_AND_ARGV_WARNING = "LightningCLI's args parameter is intended"


class FederatedCLI(LightningCLI):
    """LightningCLI with the trainer group named ``loop`` and a single seed (``loop.seed``).

    ``grid``: the Flower Grid of the ServerApp running this command
    (:mod:`fedlightning.flower_app.server`), handed to its ``FlowerBackend(address=None)``.
    ``subdirectory``: the run goes to ``<run_dir>/<subdirectory>`` (one of several seeds:
    :mod:`fedlightning.cli.runs`).
    """

    def __init__(
        self,
        args: Any = None,
        print_config: bool = False,
        grid: Any = None,
        subdirectory: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.print_resolved_config = print_config
        self.grid = grid
        self.subdirectory = subdirectory
        self.parsers: list[LightningArgumentParser] = []  # init_parser's, for error messages
        # a parse error is raised (and said in one line by parse_arguments), not printed by
        # jsonargparse with the usage; no abbreviations: --loop.round is no --loop.rounds (it
        # would silently override a --loop.rounds given before it)
        readable = {
            "formatter_class": PlainHelpFormatter, "exit_on_error": False, "allow_abbrev": False,
        }  # fmt: skip
        kwargs.setdefault(
            "parser_kwargs",
            {
                "prog": "fedlightning",
                **readable,
                "fit": {"prog": "fedlightning fit", "epilog": FIT_EPILOG, **readable},
            },
        )
        import_named_classes()
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

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """LightningCLI's parser (the command's, then each subcommand's), kept in
        :attr:`parsers`."""
        parser = super().init_parser(**kwargs)
        self.parsers.append(parser)
        return parser

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse (a mistake is a ConfigurationError of one line), then check ``--ckpt_path``
        (LightningCLI reads the file next, and a truncated or garbage file must be a one-line
        error, not its traceback)."""
        try:
            with warnings.catch_warnings():
                # LightningCLI warns when `args` and sys.argv both hold arguments; the command
                # always passes what it made of sys.argv (a seed's, a fast_dev_run's arguments)
                warnings.filterwarnings("ignore", message=ARGS_AND_ARGV_WARNING)
                super().parse_arguments(parser, args)
        except ArgumentError as error:
            options = [key for each in self.parsers for key in each.get_defaults().keys()]
            given = sys.argv[1:] if args is None else args
            given = given if isinstance(given, list) else []  # not a dict or Namespace
            raise ConfigurationError(parse_error_line(str(error), options, given)) from None
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
        # before the model and data are built: cuBLAS reads it when CUDA starts
        prepare_environment(loop.deterministic)
        if loop.run_dir is None:
            configs = self._get(self.config, "config") or []
            stem = Path(str(configs[-1])).stem if configs else "run"
            loop.run_dir = str(Path("runs") / stem)
        if self.subdirectory is not None:
            loop.run_dir = str(Path(loop.run_dir) / self.subdirectory)
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
            cause = configuration_error(err)
            if cause is None:
                raise
            note = f"# model sizes are linked from the data, which could not be read: {cause}\n"
        print(self.resolved_config() + note, end="")
        raise SystemExit(0)

    def resolved_config(self) -> str:
        """The config as YAML with every default, link target and ``run_dir`` filled in (the
        model's sizes are read from the instantiated data module: jsonargparse applies those links
        to the objects only, so the parsed config still holds the defaults), and the aggregator
        and backend the loop made where the config left them ``null`` (``AutoBackend``...)."""
        config = (self.config[self.subcommand] if self.subcommand else self.config).clone()
        datamodule = getattr(self, "datamodule", None)
        if datamodule is not None:
            for attribute in LINKED_SIZES:
                config[f"model.init_args.{attribute}"] = getattr(datamodule, attribute)
        loop = getattr(self, "trainer", None)
        for name in ("aggregator", "backend"):
            if loop is not None and config[f"loop.{name}"] is None:
                config[f"loop.{name}"] = plain(getattr(loop, name))
        return self._parser(self.subcommand).dump(config, skip_none=False, skip_link_targets=False)

    def before_fit(self) -> None:
        """Hand the resolved config to the loop, which writes ``<run_dir>/config.yaml`` once every
        start-up check passed (a refused run writes nothing)."""
        self.trainer.config_text = self.resolved_config()


def _attribute(name: str):
    def get(datamodule: FederatedDataModule) -> Any:
        return getattr(datamodule, name)

    return get


def import_named_classes() -> None:
    """Import every class :mod:`fedlightning.cli.catalog` names: jsonargparse resolves a short
    name (``--loop.aggregator FedAvgM``) among the imported subclasses of the option's type, and
    the packages import their classes on first use (:mod:`fedlightning.lazy`)."""
    with gc_paused():  # see fedlightning.gc_tuning
        for kind in KINDS:
            for name, module in kind.modules.items():
                getattr(importlib.import_module(module), name)


def fit_command(args: list[str] | None, **options: Any) -> FederatedCLI:
    """``fedlightning fit ...`` (``args`` None: the process's arguments; ``options``: those of
    :class:`FederatedCLI`). A round where every client failed alike (a bug,
    :class:`~fedlightning.loop.ClientBug`) stops the run as ``loop.on_round_failure: stop`` does:
    :class:`~fedlightning.errors.RunStopped`."""
    try:
        return FederatedCLI(args=args, **options)
    except ClientBug as bug:
        raise RunStopped(str(bug)) from None

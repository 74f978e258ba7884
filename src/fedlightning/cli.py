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

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from fedlightning.clients.base import ClientModule
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.errors import ConfigurationError, RunStopped
from fedlightning.loop import ClientBug, FederatedLoop


class FederatedCLI(LightningCLI):
    """LightningCLI with the trainer group named ``loop`` and a single seed (``loop.seed``)."""

    def __init__(self, args: Any = None, **kwargs: Any) -> None:
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
        for attribute in ("num_classes", "in_channels", "image_size"):
            parser.link_arguments(
                "data",
                f"model.init_args.{attribute}",
                compute_fn=_attribute(attribute),
                apply_on="instantiate",
            )

    def _set_seed(self) -> None:
        from lightning.fabric.utilities.seed import seed_everything

        seed_everything(self._get(self.config, "loop").seed, verbose=False)

    def before_instantiate_classes(self) -> None:
        loop = self._get(self.config, "loop")
        if loop.run_dir is None:
            configs = self._get(self.config, "config") or []
            stem = Path(str(configs[-1])).stem if configs else "run"
            loop.run_dir = str(Path("runs") / stem)

    def instantiate_trainer(self, **kwargs: Any) -> FederatedLoop:
        config = {**self._get(self.config_init, "loop", default={}), **kwargs}
        return self.trainer_class(**config)

    def before_fit(self) -> None:
        """Write the resolved config to ``<run_dir>/config.yaml`` before training."""
        run_dir = Path(self.trainer.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        dump = self._parser(self.subcommand).dump(
            self.config[self.subcommand], skip_none=False, skip_link_targets=False
        )
        (run_dir / "config.yaml").write_text(dump)


def _attribute(name: str):
    def get(datamodule: FederatedDataModule) -> Any:
        return getattr(datamodule, name)

    return get


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``fedlightning`` command; ``fedlightning plot ...`` overlays runs
    (:func:`fedlightning.analysis.plots.plot_command`); ``fedlightning cofed ...`` runs CoFED's one-shot
    pipeline (:mod:`fedlightning.cofed.cli`), which has no rounds and so no FederatedLoop;
    ``fedlightning flower-app ...`` writes a Flower App (:mod:`fedlightning.flower_app.export`)."""
    argv = sys.argv[1:] if args is None else list(args)
    try:
        if argv[:1] == ["plot"]:
            from fedlightning.analysis.plots import plot_command

            plot_command(argv[1:])
        elif argv[:1] == ["cofed"]:
            from fedlightning.cofed.cli import main as cofed_main

            cofed_main(argv[1:])
        elif argv[:1] == ["flower-app"]:
            from fedlightning.flower_app.export import main as flower_app_main

            flower_app_main(argv[1:])
        else:
            FederatedCLI(args=args)
    except (RunStopped, ClientBug) as err:
        print(f"fedlightning: stopped: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except Exception as err:
        cause = _configuration_error(err)
        if cause is None:
            raise
        print(f"fedlightning: error: {cause}", file=sys.stderr)
        raise SystemExit(2) from None


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

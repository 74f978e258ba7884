"""A registry of model builders so that configs name models by string (timm's ``create_model`` shape)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from fedlightning.errors import ConfigurationError, unknown_name

ModelBuilder = Callable[..., nn.Module]
_REGISTRY: dict[str, ModelBuilder] = {}


def register_model(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Decorator: register ``builder(num_classes, in_channels, image_size, **kwargs)`` as ``name``."""

    def decorate(builder: ModelBuilder) -> ModelBuilder:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is already registered")
        _REGISTRY[name] = builder
        return builder

    return decorate


def list_models() -> list[str]:
    """Registered model names, sorted."""
    return sorted(_REGISTRY)


def model_builder(name: str) -> ModelBuilder:
    """The builder registered as ``name`` (e.g. to inspect the options it takes)."""
    if name not in _REGISTRY:
        raise unknown_name("model", name, list_models())
    return _REGISTRY[name]


def create_model(
    name: str, num_classes: int, in_channels: int = 1, image_size: int = 28, **kwargs
) -> nn.Module:
    """Build the registered model ``name`` for ``num_classes`` classes and ``in_channels x image_size^2`` inputs."""
    builder = model_builder(name)
    if num_classes < 1 or in_channels < 1 or image_size < 1:
        raise ConfigurationError(
            f"model {name!r} needs positive num_classes, in_channels and image_size, got "
            f"{num_classes}, {in_channels}, {image_size}"
        )
    accepted = inspect.signature(builder).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            options = sorted(set(accepted) - {"num_classes", "in_channels", "image_size"})
            raise ConfigurationError(
                f"model {name!r} does not take {unknown} in network_kwargs: its options are {options}"
            )
    return builder(
        num_classes=num_classes, in_channels=in_channels, image_size=image_size, **kwargs
    )

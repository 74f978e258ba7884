"""Model registry: ``create_model(name, num_classes, in_channels, image_size)``."""

from fedlightning.models import (
    cifar,  # noqa: F401  (registers ResNet-20 and VGG-16)
    cofed_cnn,  # noqa: F401  (registers CoFED's random CNN family)
    hetero,  # noqa: F401  (registers ResNet10..26 and ViT-S/8..12)
    papers,  # noqa: F401  (registers vgg16_torchvision and FML's CNNs)
    small,  # noqa: F401  (registers the small models)
)
from fedlightning.models.registry import create_model, list_models, register_model

__all__ = ["create_model", "list_models", "register_model"]

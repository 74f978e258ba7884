"""Architectures named by the seed papers: torchvision's VGG-16 shape (FedCross Table 1),
FML's CNN1/CNN2 (FML Table 1): ``fml_cnn1``/``fml_cnn2`` as the paper's text describes them,
``fml_cnn1_code``/``fml_cnn2_code`` as the authors' released ``Model.py`` builds them, and the
MNIST CNN of Karimireddy, He and Jaggi's Byzantine experiments (``karimireddy_cnn``).

Every model follows :mod:`fedlightning.models.small`: ``features`` then ``head`` (one Linear).
"""

from __future__ import annotations

from torch import nn

from fedlightning.errors import ConfigurationError, require
from fedlightning.models.cifar import vgg16_features
from fedlightning.models.registry import register_model
from fedlightning.models.small import FeatureClassifier, lenet_classifier


@register_model("vgg16_torchvision")
def vgg16_torchvision(
    num_classes: int,
    in_channels: int,
    image_size: int,
    width: int = 64,
    hidden: int = 4096,
    dropout: float = 0.5,
) -> nn.Module:
    """torchvision's ``vgg16`` (configuration D, no BatchNorm) adapted to 32x32 inputs: thirteen
    3x3 convolutions with ReLU (``width`` x 1, 2, 4, 8, 8 channels), 2x2 max pooling after each
    block, then the ImageNet head ``Linear(d, hidden) -> ReLU -> Dropout -> Linear(hidden, hidden)
    -> ReLU -> Dropout`` and the classifier, ``hidden = 4096`` as published. The adaptation: at
    32x32 the features are 512 x 1 x 1, so ``d = 512`` is flattened directly where torchvision's
    adaptive 7x7 average pooling would copy that one position 49 times (``d = 25088``); 33.6M
    parameters at the defaults with 10 classes. A pooling that would shrink the map below 1x1 is
    skipped (as :func:`fedlightning.models.cifar.vgg16`). The BatchNorm variant with one Linear head
    is ``vgg16``.
    """
    if width < 1 or hidden < 1 or not 0.0 <= dropout < 1.0:
        raise ConfigurationError(
            f"vgg16_torchvision needs width >= 1, hidden >= 1 and dropout in [0, 1), got "
            f"{width}, {hidden}, {dropout}"
        )
    layers, features = vgg16_features(in_channels, image_size, width, batch_norm=False)
    layers += [
        nn.Flatten(),
        nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
    ]  # fmt: skip
    return FeatureClassifier(nn.Sequential(*layers), hidden, num_classes)


@register_model("fml_cnn1")
def fml_cnn1(num_classes: int, in_channels: int, image_size: int, hidden: int = 120) -> nn.Module:
    """FML's CNN1 as the paper's text describes it (Shen et al. 2020, arXiv:2006.16765): two 3x3
    convolutions with 6 and 16 channels and two fully connected layers,
    ``conv3x3(6) -> ReLU -> pool2 -> conv3x3(16) -> ReLU -> pool2 -> hidden -> classes``.

    The text gives kernel sizes, channels and layer counts only; the rest is ours
    (docs/algorithms.md section 1.6): 'same' padding and a 2x2 max pooling after each convolution,
    as in the FedAvg CNN the paper compares against (16 x 7 x 7 features at 28x28, 16 x 8 x 8 at
    32x32; any side >= 4), and ``hidden = 120``, LeNet-5's first width, whose 6/16 channels CNN1
    shares. The authors' released ``CNNCifar`` (5x5, three FC layers) is ``fml_cnn1_code``.
    """
    side = image_size // 2 // 2
    _check("fml_cnn1", image_size, side, 4)
    require(hidden >= 1, "fml_cnn1 hidden", hidden, "an integer >= 1")
    features = nn.Sequential(
        nn.Conv2d(in_channels, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * side * side, hidden), nn.ReLU(),
    )  # fmt: skip
    return FeatureClassifier(features, hidden, num_classes)


@register_model("fml_cnn2")
def fml_cnn2(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """FML's CNN2 as the paper's text describes it (Shen et al. 2020): three 3x3
    convolutions with 128 channels and one fully connected layer, ``3 x (conv3x3(128) -> ReLU ->
    pool2) -> classes``.

    Padding and pooling are ours, as for :func:`fml_cnn1` (docs/algorithms.md section 1.6):
    'same' padding and a 2x2 max pooling after each convolution, so the one fully connected layer
    (the classifier ``head``) sees 128 x 3 x 3 features at 28x28 and 128 x 4 x 4 at 32x32 (any
    side >= 8). The authors' released ``CNN`` (32/64/64 channels, two FC layers) is
    ``fml_cnn2_code``.
    """
    side = image_size // 2 // 2 // 2
    _check("fml_cnn2", image_size, side, 8)
    layers: list[nn.Module] = []
    for channels_in in (in_channels, 128, 128):
        layers += [nn.Conv2d(channels_in, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
    features = nn.Sequential(*layers, nn.Flatten())
    return FeatureClassifier(features, 128 * side * side, num_classes)


@register_model("fml_cnn1_code")
def fml_cnn1_code(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """FML's CNN1 as the authors' released ``Model.py`` builds it (``CNNCifar``):
    ``conv5x5(6) -> ReLU -> pool2 -> conv5x5(16) -> ReLU -> pool2 -> 120 -> 84`` with unpadded
    convolutions (16 x 5 x 5 features at 32x32, 16 x 4 x 4 at 28x28). The paper's text describes
    another network: :func:`fml_cnn1`."""
    side = ((image_size - 4) // 2 - 4) // 2
    _check("fml_cnn1_code", image_size, side, 16)
    return lenet_classifier(num_classes, in_channels, side, padding=0)


@register_model("fml_cnn2_code")
def fml_cnn2_code(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """FML's CNN2 as the authors' released ``Model.py`` builds it (``CNN``): ``conv3x3(32) ->
    ReLU -> pool2 -> conv3x3(64) -> ReLU -> pool2 -> conv3x3(64) -> ReLU -> 64``, unpadded
    (64 x 4 x 4 features at 32x32, 64 x 3 x 3 at 28x28). The paper's text describes another
    network: :func:`fml_cnn2`."""
    side = ((image_size - 2) // 2 - 2) // 2 - 2
    _check("fml_cnn2_code", image_size, side, 18)
    features = nn.Sequential(
        nn.Conv2d(in_channels, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * side * side, 64), nn.ReLU(),
    )  # fmt: skip
    return FeatureClassifier(features, 64, num_classes)


@register_model("karimireddy_cnn")
def karimireddy_cnn(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """The MNIST network of Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous
    Datasets via Bucketing" (ICLR 2022, arXiv:2006.09365) as their code builds it
    (``epfml/byzantine-robust-noniid-optimizer``, ``codes/tasks/mnist.py``, ``Net``: the PyTorch
    MNIST example of its time): ``conv3x3(32) -> ReLU -> conv3x3(64) -> pool2 -> Dropout2d(0.25)
    -> fc 128 -> ReLU -> Dropout(0.5) -> classes``, unpadded (64 x 12 x 12 = 9,216 features at
    28x28; any side >= 6). As there, the second convolution is pooled without a ReLU; their
    ``Dropout2d(0.5)`` on the 128 features (a 2-d input: one value per channel) is the element-wise
    ``Dropout(0.5)`` here; their ``log_softmax`` and NLL loss are the cross-entropy on the logits.
    """
    side = (image_size - 4) // 2
    _check("karimireddy_cnn", image_size, side, 6)
    features = nn.Sequential(
        nn.Conv2d(in_channels, 32, 3), nn.ReLU(),
        nn.Conv2d(32, 64, 3), nn.MaxPool2d(2), nn.Dropout2d(0.25),
        nn.Flatten(),
        nn.Linear(64 * side * side, 128), nn.ReLU(), nn.Dropout(0.5),
    )  # fmt: skip
    return FeatureClassifier(features, 128, num_classes)


def _check(name: str, image_size: int, side: int, minimum: int) -> None:
    if side < 1:
        raise ConfigurationError(f"model {name!r} needs image_size >= {minimum}, got {image_size}")

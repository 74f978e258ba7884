"""InCo's layer pairs recomputed from the paper's text (Chan et al., ICLR 2024, section 3;
docs/algorithms.md section 2.4): in each stage, layer 0 is the first layer that satisfies the
shape condition and every later layer k (0 < k <= N) of the stage with its shape is paired with
it; and the default pairs, the authors' code's."""

from __future__ import annotations

import pytest

from fedlightning.models import create_model
from fedlightning.server import InCo
from fedlightning.server.inco_pairs import inco_pairs, resnet_pairs

#: blocks per stage of ResNet10..26 (docs/algorithms.md section 2.4), written out independently
BLOCKS = {10: [1, 1, 1, 1], 14: [1, 1, 2, 2], 18: [2, 2, 2, 2], 22: [2, 2, 3, 3], 26: [3, 3, 3, 3]}
WIDTH = 4


def _conv(stage, block, index):
    return f"layer{stage}.{block}.conv{index}.weight"


def test_resnet14_pairs_by_hand():
    state = create_model("resnet14", 10, 1, 8, width=WIDTH).state_dict()
    # stage 1 keeps the stem's width, so block 0's conv1 is layer 0 and its conv2 a layer k;
    # stages 2-4 widen in block 0's conv1, so layer 0 is block 0's conv2; stage 2 has no layer k
    assert inco_pairs(state, "resnet", layer0="paper") == [
        ("layer1.0.conv2.weight", "layer1.0.conv1.weight"),
        ("layer3.1.conv1.weight", "layer3.0.conv2.weight"),
        ("layer3.1.conv2.weight", "layer3.0.conv2.weight"),
        ("layer4.1.conv1.weight", "layer4.0.conv2.weight"),
        ("layer4.1.conv2.weight", "layer4.0.conv2.weight"),
    ]
    # the authors' code: blocks j >= 1 only, layer 0 always layer{s}.0.conv2
    assert inco_pairs(state, "resnet", layer0="code") == [
        ("layer3.1.conv1.weight", "layer3.0.conv2.weight"),
        ("layer3.1.conv2.weight", "layer3.0.conv2.weight"),
        ("layer4.1.conv1.weight", "layer4.0.conv2.weight"),
        ("layer4.1.conv2.weight", "layer4.0.conv2.weight"),
    ]
    resnet10 = create_model("resnet10", 10, 1, 8, width=WIDTH).state_dict()
    assert inco_pairs(resnet10, "resnet", layer0="paper") == [
        ("layer1.0.conv2.weight", "layer1.0.conv1.weight")
    ]


def _paper_pairs_from_the_text(blocks):
    """The paper's rule on the architecture as specified (3x3 convs of BasicBlocks; stage s has
    ``WIDTH * 2**(s-1)`` channels, the stem ``WIDTH``), without reading the model."""
    pairs = []
    for stage, count in enumerate(blocks, start=1):
        width, width_in = WIDTH * 2 ** (stage - 1), WIDTH * 2 ** max(stage - 2, 0)
        layers = []
        for block in range(count):
            layers.append((_conv(stage, block, 1), (width, width_in if block == 0 else width)))
            layers.append((_conv(stage, block, 2), (width, width)))
        shapes = [shape for _, shape in layers]
        zero = next(
            (i for i, shape in enumerate(shapes) if shape in shapes[i + 1 :]), None
        )  # the first layer satisfying the shape condition
        if zero is not None:
            pairs += [
                (key, layers[zero][0]) for key, shape in layers[zero + 1 :] if shape == shapes[zero]
            ]
    return pairs


@pytest.mark.parametrize("depth", sorted(BLOCKS))
def test_paper_pairs_over_the_resnet_family(depth):
    state = create_model(f"resnet{depth}", 10, 1, 8, width=WIDTH).state_dict()
    expected = _paper_pairs_from_the_text(BLOCKS[depth])
    assert inco_pairs(state, "resnet", layer0="paper") == expected
    # every 3x3 conv of a stage is paired except its layer 0 and a widening first conv
    convs = {k for k in state if ".conv" in k and k.startswith("layer")}
    unpaired = convs - {deep for deep, _ in expected}
    assert unpaired == {"layer1.0.conv1.weight"} | {
        _conv(s, 0, c) for s in (2, 3, 4) for c in (1, 2)
    }
    # the paper's reading adds exactly stage 1's block-0 conv2 to the code's deep layers
    code = inco_pairs(state, "resnet", layer0="code")
    assert {d for d, _ in expected} - {d for d, _ in code} == {"layer1.0.conv2.weight"}


def test_default_is_the_authors_code_throughout():
    inco = InCo()
    assert (inco.variant, inco.layer0) == ("official", "code")
    state = create_model("resnet18", 10, 1, 8, width=WIDTH).state_dict()
    inco.setup(state, 4)
    assert inco.pairs == resnet_pairs(list(state))
    paper = InCo(variant="paper", layer0="paper")
    paper.setup(state, 4)
    assert paper.pairs == _paper_pairs_from_the_text(BLOCKS[18])

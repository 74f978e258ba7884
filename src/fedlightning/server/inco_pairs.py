"""InCo's layer pairs: Chan et al., "Internal Cross-layer Gradients for Extending Homogeneity to
Heterogeneity in Federated Learning", ICLR 2024, arXiv:2308.11464 (section 3; docs/algorithms.md
section 2.4): which deep layer's server update is mixed with which stage's layer 0.

Two readings, the option ``layer0``: ``code`` takes the pairs of a rule per model family, as the
authors' released code pairs them (:func:`resnet_pairs`, :func:`vit_pairs`); ``paper`` applies the
paper's wording to the layers of each stage (:func:`paper_pairs`): layer 0 is the first layer of the
stage that satisfies the shape condition, and every later layer of the stage with its shape is a
layer k, 0 < k <= N. A model family declares its own pairs with :func:`register_pair_rule` and its
stages with :func:`register_stage_rule`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import StateDict

PairRule = Callable[[Sequence[str]], list[tuple[str, str]]]
PAIR_RULES: dict[str, PairRule] = {}
#: ``stages(keys) -> [[layer key, ...] per stage, in the model's order]``: the layers the paper's
#: rule looks at in each stage of a model family
StageRule = Callable[[Sequence[str]], list[list[str]]]
STAGE_RULES: dict[str, StageRule] = {}


def register_pair_rule(name: str) -> Callable[[PairRule], PairRule]:
    """Decorator: register ``rule(keys) -> [(deep key, layer-0 key), ...]`` as ``name``. This is how
    a model family declares its own pairs; ``pair_rule="auto"`` applies every registered rule."""

    def decorate(rule: PairRule) -> PairRule:
        PAIR_RULES[name] = rule
        return rule

    return decorate


def register_stage_rule(name: str) -> Callable[[StageRule], StageRule]:
    """Decorator: register ``rule(keys) -> [[layer key, ...] per stage]`` for the pair rule
    ``name``, the layers (in the model's order) among which ``layer0="paper"`` chooses layer 0 and
    the layers k (:func:`paper_pairs`). A pair rule without one keeps its own deep layers under
    ``layer0="paper"``, with layer 0 re-chosen by :func:`paper_layer0`."""

    def decorate(rule: StageRule) -> StageRule:
        STAGE_RULES[name] = rule
        return rule

    return decorate


def _group_by_stage(keys: Sequence[str], pattern: str) -> list[list[str]]:
    """The keys that fully match ``pattern`` (whose first group is the stage), grouped by stage in
    order of first appearance, each stage's keys in the model's order."""
    stages: dict[str, list[str]] = {}
    for key in keys:
        match = re.fullmatch(pattern, key)
        if match:
            stages.setdefault(match.group(1), []).append(key)
    return list(stages.values())


@register_stage_rule("resnet")
def resnet_stages(keys: Sequence[str]) -> list[list[str]]:
    """The 3x3 convolutions ``layer{s}.{j}.conv{1,2}.weight`` of every block j, per stage s (stem,
    BatchNorm, downsample and classifier are not layers of a stage here)."""
    return _group_by_stage(keys, r"(.*?layer\d+)\.\d+\.conv[12]\.weight")


@register_stage_rule("vit")
def vit_stages(keys: Sequence[str]) -> list[list[str]]:
    """``norm1.weight`` and ``norm2.weight`` of every block (timm names), one stage per block."""
    return _group_by_stage(keys, r"(.*?blocks\.\d+)\.norm[12]\.weight")


def paper_pairs(state: StateDict, stages: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    """The paper's pairs: in each stage, layer 0 is the first layer whose shape a later layer of the
    stage has (the shape condition), and every later layer with that shape is a layer k paired
    with it. Layers of another shape stay unpaired.

    >>> import torch
    >>> w = lambda *s: torch.zeros(s)
    >>> state = {"layer1.0.conv1.weight": w(4, 4, 3, 3), "layer1.0.conv2.weight": w(4, 4, 3, 3),
    ...          "layer2.0.conv1.weight": w(8, 4, 3, 3), "layer2.0.conv2.weight": w(8, 8, 3, 3),
    ...          "layer2.1.conv1.weight": w(8, 8, 3, 3)}
    >>> paper_pairs(state, resnet_stages(list(state)))
    [('layer1.0.conv2.weight', 'layer1.0.conv1.weight'), ('layer2.1.conv1.weight', 'layer2.0.conv2.weight')]
    """
    pairs = []
    for layers in stages:
        for index, first in enumerate(layers):
            later = [k for k in layers[index + 1 :] if state[k].shape == state[first].shape]
            if later:
                pairs += [(deep, first) for deep in later]
                break
    return pairs


@register_pair_rule("resnet")
def resnet_pairs(keys: Sequence[str]) -> list[tuple[str, str]]:
    """``layer{s}.{j}.conv1.weight`` and ``layer{s}.{j}.conv2.weight`` for blocks ``j >= 1``, each
    with ``layer{s}.0.conv2.weight``; stem, block 0, BN, downsample and the classifier are left out.
    Any name prefix (e.g. ``backbone.``) is allowed."""
    present = set(keys)
    pairs = []
    for key in keys:
        match = re.fullmatch(r"(.*?)layer(\d+)\.(\d+)\.conv[12]\.weight", key)
        if match and int(match.group(3)) >= 1:
            layer0 = f"{match.group(1)}layer{match.group(2)}.0.conv2.weight"
            if layer0 in present:
                pairs.append((key, layer0))
    return pairs


@register_pair_rule("vit")
def vit_pairs(keys: Sequence[str]) -> list[tuple[str, str]]:
    """``blocks.{i}.norm2.weight`` with ``blocks.{i}.norm1.weight`` in every block (timm names)."""
    present = set(keys)
    pairs = []
    for key in keys:
        match = re.fullmatch(r"(.*?)blocks\.(\d+)\.norm2\.weight", key)
        if match:
            layer0 = f"{match.group(1)}blocks.{match.group(2)}.norm1.weight"
            if layer0 in present:
                pairs.append((key, layer0))
    return pairs


#: a deep layer's stage: a ResNet stage ``layer{s}.`` or a ViT block ``blocks.{i}.``
_STAGE = re.compile(r"(.*?(?:layer\d+|blocks\.\d+)\.)")


def paper_layer0(state: StateDict, deep: str) -> str | None:
    """Layer 0 as the InCo paper words it: the first layer (``.weight`` key, in the model's order)
    of ``deep``'s stage with ``deep``'s shape. For ResNets this is ``layer{s}.0.conv2.weight``
    except in a stage whose block 0 keeps the width (stage 1 of the ResNet10..26 family), where
    ``layer{s}.0.conv1.weight`` comes first; for ViT blocks it is ``norm1.weight`` as before.

    >>> import torch
    >>> w = lambda *s: torch.zeros(s)
    >>> state = {"layer1.0.conv1.weight": w(4, 4, 3, 3), "layer1.0.conv2.weight": w(4, 4, 3, 3),
    ...          "layer1.1.conv1.weight": w(4, 4, 3, 3), "layer2.0.conv1.weight": w(8, 4, 3, 3),
    ...          "layer2.0.conv2.weight": w(8, 8, 3, 3), "layer2.1.conv1.weight": w(8, 8, 3, 3)}
    >>> paper_layer0(state, "layer1.1.conv1.weight"), paper_layer0(state, "layer2.1.conv1.weight")
    ('layer1.0.conv1.weight', 'layer2.0.conv2.weight')
    """
    match = _STAGE.match(deep)
    if match is None:
        return None
    prefix, shape = match.group(1), state[deep].shape
    for key in state:
        if key.startswith(prefix) and key.endswith(".weight") and state[key].shape == shape:
            return key if key != deep else None
    return None


def inco_pairs(
    state: StateDict,
    rule: str = "auto",
    pairs: Iterable[Sequence[str]] | None = None,
    layer0: str = "code",
) -> list[tuple[str, str]]:
    """The (deep layer, layer 0) pairs of the model ``state``: the explicit ``pairs`` if given,
    else those of the registered ``rule`` (``auto``: every registered rule). ``layer0="code"``:
    the rule's own pairs (the authors' code); ``"paper"``: :func:`paper_pairs` over the rule's
    stages (:func:`register_stage_rule`), which adds the layers of a stage that the code leaves
    out (in ResNet stage 1, ``layer1.0.conv2`` with layer 0 ``layer1.0.conv1``). Both keys must
    exist and have the same shape, and a layer 0 must not itself be a deep layer."""
    require(layer0 in ("paper", "code"), "aggregator.layer0", layer0, "'paper' or 'code'")
    if pairs is None:
        require(
            rule == "auto" or rule in PAIR_RULES,
            "aggregator.pair_rule",
            rule,
            f"'auto' or one of {', '.join(sorted(PAIR_RULES))}",
        )
    if pairs is not None:
        found = [(str(p[0]), str(p[1])) for p in pairs]
    else:
        names = list(PAIR_RULES) if rule == "auto" else [rule]
        found = list(dict.fromkeys(p for name in names for p in _rule_pairs(state, name, layer0)))
    for deep, zero in found:
        for key in (deep, zero):
            if key not in state:
                raise ConfigurationError(
                    f"aggregator.pairs: {key!r} is not a key of the server model"
                )
        if state[deep].shape != state[zero].shape:
            raise ConfigurationError(
                f"aggregator.pairs: {deep} {tuple(state[deep].shape)} and {zero} "
                f"{tuple(state[zero].shape)} differ in shape"
            )
    if {d for d, _ in found} & {z for _, z in found}:
        raise ConfigurationError("aggregator.pairs: a layer 0 is also paired as a deep layer")
    return found


def _rule_pairs(state: StateDict, name: str, layer0: str) -> list[tuple[str, str]]:
    """The pairs of the registered rule ``name`` under the ``layer0`` reading."""
    keys = list(state)
    if layer0 == "code":
        return PAIR_RULES[name](keys)
    if name in STAGE_RULES:
        return paper_pairs(state, STAGE_RULES[name](keys))
    return [(deep, paper_layer0(state, deep) or zero) for deep, zero in PAIR_RULES[name](keys)]

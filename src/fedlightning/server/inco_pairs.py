"""InCo's layer pairs: Chan et al., "Internal Cross-layer Gradients for Extending Homogeneity to
Heterogeneity in Federated Learning", ICLR 2024, arXiv:2308.11464 (section 3; docs/algorithms.md
section 2.4): which deep layer's server update is mixed with which stage's layer 0, by a rule per
model family. A model family declares its own with :func:`register_pair_rule`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import StateDict

PairRule = Callable[[Sequence[str]], list[tuple[str, str]]]
PAIR_RULES: dict[str, PairRule] = {}


def register_pair_rule(name: str) -> Callable[[PairRule], PairRule]:
    """Decorator: register ``rule(keys) -> [(deep key, layer-0 key), ...]`` as ``name``. This is how
    a model family declares its own pairs; ``pair_rule="auto"`` applies every registered rule."""

    def decorate(rule: PairRule) -> PairRule:
        PAIR_RULES[name] = rule
        return rule

    return decorate


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
    layer0: str = "paper",
) -> list[tuple[str, str]]:
    """The (deep layer, layer 0) pairs of the model ``state``: the explicit ``pairs`` if given,
    else those of the registered ``rule`` (``auto``: every registered rule), whose layer 0 is then
    re-chosen by :func:`paper_layer0` when ``layer0="paper"`` (``"code"``: the rule's own, the
    authors' code). Both keys must exist and have the same shape, and a layer 0 must not itself be
    a deep layer."""
    require(layer0 in ("paper", "code"), "aggregator.layer0", layer0, "'paper' or 'code'")
    if pairs is not None:
        found = [(str(p[0]), str(p[1])) for p in pairs]
    elif rule == "auto":
        found = list(dict.fromkeys(p for r in PAIR_RULES.values() for p in r(list(state))))
    else:
        require(
            rule in PAIR_RULES,
            "aggregator.pair_rule",
            rule,
            f"'auto' or one of {', '.join(sorted(PAIR_RULES))}",
        )
        found = PAIR_RULES[rule](list(state))
    if pairs is None and layer0 == "paper":
        found = [(deep, paper_layer0(state, deep) or zero) for deep, zero in found]
    for deep, layer0 in found:
        for key in (deep, layer0):
            if key not in state:
                raise ConfigurationError(
                    f"aggregator.pairs: {key!r} is not a key of the server model"
                )
        if state[deep].shape != state[layer0].shape:
            raise ConfigurationError(
                f"aggregator.pairs: {deep} {tuple(state[deep].shape)} and {layer0} "
                f"{tuple(state[layer0].shape)} differ in shape"
            )
    if {d for d, _ in found} & {z for _, z in found}:
        raise ConfigurationError("aggregator.pairs: a layer 0 is also paired as a deep layer")
    return found

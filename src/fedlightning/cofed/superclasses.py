"""Fine -> superclass tables for CoFED's label-space tasks (docs/algorithms.md section 3, "Tasks"):
CIFAR-100's 20 superclasses, the digits' 5 stroke-sharing pairs, and :func:`group_table`, which
turns groups of fine classes into a ``table[fine] = group`` lookup.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: CIFAR-100's 20 superclasses and their 5 fine classes each (Krizhevsky 2009, the data set's
#: definition); superclass ids follow this (alphabetical) order, as in the data set's coarse labels.
CIFAR100_SUPERCLASSES: dict[str, tuple[str, ...]] = {
    "aquatic_mammals": ("beaver", "dolphin", "otter", "seal", "whale"),
    "fish": ("aquarium_fish", "flatfish", "ray", "shark", "trout"),
    "flowers": ("orchid", "poppy", "rose", "sunflower", "tulip"),
    "food_containers": ("bottle", "bowl", "can", "cup", "plate"),
    "fruit_and_vegetables": ("apple", "mushroom", "orange", "pear", "sweet_pepper"),
    "household_electrical_devices": ("clock", "keyboard", "lamp", "telephone", "television"),
    "household_furniture": ("bed", "chair", "couch", "table", "wardrobe"),
    "insects": ("bee", "beetle", "butterfly", "caterpillar", "cockroach"),
    "large_carnivores": ("bear", "leopard", "lion", "tiger", "wolf"),
    "large_man-made_outdoor_things": ("bridge", "castle", "house", "road", "skyscraper"),
    "large_natural_outdoor_scenes": ("cloud", "forest", "mountain", "plain", "sea"),
    "large_omnivores_and_herbivores": ("camel", "cattle", "chimpanzee", "elephant", "kangaroo"),
    "medium_mammals": ("fox", "porcupine", "possum", "raccoon", "skunk"),
    "non-insect_invertebrates": ("crab", "lobster", "snail", "spider", "worm"),
    "people": ("baby", "boy", "girl", "man", "woman"),
    "reptiles": ("crocodile", "dinosaur", "lizard", "snake", "turtle"),
    "small_mammals": ("hamster", "mouse", "rabbit", "shrew", "squirrel"),
    "trees": ("maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree"),
    "vehicles_1": ("bicycle", "bus", "motorcycle", "pickup_truck", "train"),
    "vehicles_2": ("lawn_mower", "rocket", "streetcar", "tank", "tractor"),
}
#: fine class names in label order (alphabetical, as CIFAR-100's fine labels and torchvision)
CIFAR100_CLASSES: tuple[str, ...] = tuple(
    sorted(name for names in CIFAR100_SUPERCLASSES.values() for name in names)
)

#: Superclass-like groups for the 10 digits: pairs that share strokes and are the digits' most
#: frequent confusions (1/7 a vertical stroke with a head, 4/9 a closed or open top loop on a stem,
#: 3/8 two stacked right bowls, 0/6 a closed lower loop, 2/5 a top bar and a lower curve). Like a
#: CIFAR-100 superclass, a group's members are related but not interchangeable, so a participant
#: that saw one digit of a group (non-IID) must learn the other from someone else.
DIGIT_GROUPS: dict[str, tuple[int, int]] = {
    "0/6": (0, 6),
    "1/7": (1, 7),
    "2/5": (2, 5),
    "3/8": (3, 8),
    "4/9": (4, 9),
}


def group_table(
    groups: Sequence[Sequence[int | str]], classes: Sequence[str] | None = None
) -> np.ndarray:
    """``table[fine] = group index`` from groups of fine class ids (or names found in ``classes``)."""
    index = {name: k for k, name in enumerate(classes or ())}
    members = [[index[m] if isinstance(m, str) else int(m) for m in group] for group in groups]
    table = np.full(sum(len(m) for m in members), -1, dtype=np.int64)
    for g, group in enumerate(members):
        table[group] = g
    return table


#: built-in fine -> superclass tables
BUILTIN_SUPERCLASSES: dict[str, tuple[np.ndarray, tuple[str, ...]]] = {
    "cifar100": (
        group_table(list(CIFAR100_SUPERCLASSES.values()), CIFAR100_CLASSES),
        tuple(CIFAR100_SUPERCLASSES),
    ),
    "digits": (group_table(list(DIGIT_GROUPS.values())), tuple(DIGIT_GROUPS)),
}

"""The run's round components as part of its identity (docs/algorithms.md section 6.2;
:mod:`fedlightning.loop.identity`).

A run's configured components (``loop.components`` with the shorthands ``loop.attack`` and
``loop.target_acc``) are stored in its identity as ``{class_path, init_args}`` each, in order,
whichever spelling gave them. A resume must run the same ones: a component added would start its
state afresh mid-run (a running mean from 0), one removed would end its columns, one moved would
change the order of effects, one with another option would compute something else. Only the
options a component lists in ``resume_may_change`` may change (the target tracker's ``target``);
anything else is refused in one line naming the component.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from fedlightning.loop.components.adversary import Adversary
from fedlightning.loop.config_diff import differences, short
from fedlightning.loop.targets import TargetTracker
from fedlightning.round_components import RoundComponent
from fedlightning.run_config import normalise, plain, public_class_path

#: the built-ins a config lists: the option of theirs a shorthand of the loop sets (here, not in
#: the package's ``__init__``, which imports the run's path and through it the run's identity)
SHORTHANDS: dict[type[RoundComponent], tuple[str, str]] = {
    Adversary: ("attack", "loop.attack"),
    TargetTracker: ("target", "loop.target_acc"),
}
TODO = "resume with the components the checkpoint's run had (docs/algorithms.md section 6.2)"


def component_identity(components: Sequence[RoundComponent]) -> list[dict[str, Any]]:
    """Each configured component as ``{class_path, init_args}``, normalised as the config is."""
    return [normalise(plain(component)) for component in components]


def components_of(identity: dict[str, Any]) -> list[dict[str, Any]]:
    """An identity's components; one written before they were part of the identity ran the
    adversary of its config's ``loop.attack`` (if any) and the target tracker of its
    ``loop.target_acc`` (and no component of a user's)."""
    if "components" in identity:
        return list(identity["components"])
    loop = identity["config"].get("loop") or {}
    attack = loop.get("attack")
    adversary = {"class_path": public_class_path(Adversary), "init_args": {"attack": attack}}
    target = loop.get("target_acc")
    tracker = {
        "class_path": public_class_path(TargetTracker),
        "init_args": {"target": target, "metric": "test_acc"},
    }
    return [adversary, tracker] if attack is not None else [tracker]


def component_difference(stored: list[dict[str, Any]], current: list[dict[str, Any]]) -> str | None:
    """Why a run with the ``current`` components cannot resume a checkpoint of the ``stored``
    ones (module docstring), or None."""
    old, new = [_name(c) for c in stored], [_name(c) for c in current]
    if old != new:
        added = [n for n in new if n not in old]
        removed = [n for n in old if n not in new]
        what = (
            f"{', '.join(added)} added: its state would start afresh mid-run" if added
            else f"{', '.join(removed)} removed: its state and columns would end mid-run"
            if removed else "another order: another order of effects"
        )  # fmt: skip
        return (
            f"its round components are [{', '.join(old)}] in the checkpoint but "
            f"[{', '.join(new)}] in this run ({what}); {TODO}"
        )
    for before, now, name in zip(stored, current, new, strict=True):
        may_change = _resume_may_change(now["class_path"])
        for path, was, becomes in differences(before.get("init_args"), now.get("init_args")):
            if path.split(".")[0] not in may_change:
                return (
                    f"the round component {name}'s option {path}{_shorthand(now, path)} is "
                    f"{short(was)} in the checkpoint but {short(becomes)} in this run; {TODO}"
                )
    return None


def _shorthand(description: dict[str, Any], path: str) -> str:
    """`` (loop.attack.init_args.fraction)`` where a shorthand of the loop spells the option at
    ``path`` of the component ``description``; nothing otherwise."""
    for kind, (argument, option) in SHORTHANDS.items():
        if description["class_path"] == public_class_path(kind) and path.split(".")[0] == argument:
            return f" ({option}{path[len(argument) :]})"
    return ""


def _name(description: dict[str, Any]) -> str:
    return str(description.get("class_path", "?")).rsplit(".", 1)[-1]


def _resume_may_change(class_path: str) -> frozenset[str]:
    """The options the component class of ``class_path`` lets a resume change (none when it
    cannot be imported)."""
    module, _, name = class_path.rpartition(".")
    try:
        kind = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return frozenset()
    return frozenset(getattr(kind, "resume_may_change", ()))

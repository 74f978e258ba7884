"""Where two resolved configs differ, option by option (:mod:`fedlightning.loop.identity` compares
a checkpoint's config with a resumed run's; the round components' options are compared the same
way, :mod:`fedlightning.loop.components.identity`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class _NotSet:
    """An option one side of a comparison lacks."""

    def __repr__(self) -> str:
        return "not set"


NOT_SET = _NotSet()


def differences(old: Any, new: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """``(path, old value, new value)`` of every option in which two configs differ, in ``old``'s
    order; an object whose class differs is one difference (``loop.aggregator``), its
    ``init_args`` are not compared."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        if old != new:
            yield path, old, new
        return
    if ("class_path" in old or "class_path" in new) and old.get("class_path") != new.get(
        "class_path"
    ):
        yield path, old.get("class_path", NOT_SET), new.get("class_path", NOT_SET)
        return
    for key in [*old, *(k for k in new if k not in old)]:
        if key == "class_path":
            continue
        option = f"{path}.{key}" if path else str(key)
        yield from differences(old.get(key, NOT_SET), new.get(key, NOT_SET), option)


def short(value: Any, limit: int = 200) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."

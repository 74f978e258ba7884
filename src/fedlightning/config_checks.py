"""One value per option: a config file or a command line that says two things is refused.

YAML parsers keep the last of two equal keys in one mapping (``rounds: 2`` then ``rounds: 3``
runs 3 rounds without a word), and argument parsers keep the last of an option given twice. The
commands (``fit``, ``cofed``, ``plot``) refuse both before parsing, naming what was said twice:

- :func:`check_yaml_keys`: a mapping with a key given twice, named by its path in the file
  (``loop.aggregator.init_args.noise_multiplier``) and both lines; read with PyYAML's public
  composer (:func:`yaml.compose`), which keeps every key of a mapping with its line;
- :func:`check_repeated_options`: an option given twice on the command line with different
  values, in any of its spellings: ``--model.lr`` and ``--model.init_args.lr`` (jsonargparse
  reads both as the one option), ``--model`` and ``--model.class_path``, and a dotted option and
  the same entry inside an inline mapping (``--loop.aggregator '{class_path: FedAvgM,
  init_args: {momentum: 0.9}}' --loop.aggregator.momentum 0.5``); an inline YAML/JSON value
  that gives a key twice is refused as a file is. A config file then the command line is an
  override, not a repetition (``-c`` files may be given several times: each later one
  overrides, as documented, and so may a group's file, ``--loop FILE``), and so is an option
  given twice with one value; ``--name+=value`` appends to a list, after which the new item's
  options (``--name.option``) may be given again. Abbreviated options (``--loop.round`` for
  ``--loop.rounds``) are no spelling: every parser of the command refuses them
  (``allow_abbrev=False``), as argparse would otherwise take them silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from fedlightning.errors import ConfigurationError

#: options that may repeat (config files layer, later over earlier)
REPEATABLE = frozenset({"-c", "--config"})
MERGE_TAG = "tag:yaml.org,2002:merge"
#: the end of every refusal of an option given twice
OVERRIDE_NOTE = "(an option in a -c file is overridden by the command line, not repeated)"


def check_yaml_keys(text: str, source: str) -> None:
    """Raise a ConfigurationError naming the key and both lines when a mapping in the YAML
    ``text`` (read from ``source``, named in the message) holds a key twice. Text that is not
    YAML is left to the parser, which says so itself.

    >>> check_yaml_keys("loop:\\n  rounds: 2\\n  rounds: 3\\n", "run.yaml")
    Traceback (most recent call last):
    ...
    fedlightning.errors.ConfigurationError: run.yaml gives loop.rounds twice (line 2 and line 3) ...
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return
    for key, first, second in _duplicates(root, "", set()):
        where = f"line {first.line + 1} and line {second.line + 1}"
        if "\n" not in text.strip():  # an inline value: one line
            where = f"column {first.column + 1} and column {second.column + 1}"
        raise ConfigurationError(
            f"{source} gives {key} twice ({where}) in one mapping, and YAML would silently keep "
            "the last: keep one of them"
        )


def _duplicates(
    node: yaml.Node | None, path: str, seen: set[int]
) -> Iterator[tuple[str, yaml.Mark, yaml.Mark]]:
    """``(key path, first place, second place)`` of each key given twice under ``node``."""
    if node is None or id(node) in seen:  # an alias of a node already walked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        places: dict[tuple[str, str], yaml.Mark] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == MERGE_TAG:
                continue
            inner = f"{path}.{key.value}" if path else key.value
            if (key.tag, key.value) in places:
                yield inner, places[key.tag, key.value], key.start_mark
            places.setdefault((key.tag, key.value), key.start_mark)
            yield from _duplicates(value, inner, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicates(item, f"{path}[{index}]", seen)


def check_repeated_options(argv: Sequence[str]) -> None:
    """Raise a ConfigurationError when ``argv`` (a command's arguments) gives an option twice
    with different values, in any of its spellings, naming both (module docstring); and when an
    inline YAML/JSON value gives a key twice (:func:`check_yaml_keys`)."""
    whole: dict[str, _Setting] = {}  # each option's value, as given
    leaves: dict[str, _Setting] = {}  # each setting, from dotted names and inline mappings
    for name, value in _options(argv):
        if name.endswith("+"):  # a new list item: its options may be given again
            item = f"{_canonical(name[:-1])}."
            for settings in (whole, leaves):
                for key in [k for k in settings if k.startswith(item)]:
                    del settings[key]
            continue
        if name in REPEATABLE:
            continue
        parsed = _parsed(name, value)
        given = _Setting(name, value, parsed)
        _record(whole, name.lstrip("-"), given)
        for key, setting in _leaves(name, _canonical(name), given):
            _record(leaves, key, setting)


@dataclass(frozen=True)
class _Setting:
    """One value given on the command line: the option as spelled, the text, the value it
    means (YAML, as jsonargparse reads it)."""

    spelling: str
    text: str | None
    value: Any


def _record(settings: dict[str, _Setting], key: str, given: _Setting) -> None:
    """Keep ``given`` under ``key``, or refuse it when ``key`` already holds another value."""
    first = settings.setdefault(key, given)
    if first.value == given.value:
        return
    if first.spelling == given.spelling:
        raise ConfigurationError(
            f"{given.spelling} is given twice on the command line, as {first.text!r} and as "
            f"{given.text!r}: give it once {OVERRIDE_NOTE}"
        )
    raise ConfigurationError(
        f"{first.spelling} {first.text!r} and {given.spelling} {given.text!r} set the same "
        f"option ({key}) on the command line: give it once, in one spelling {OVERRIDE_NOTE}"
    )


def _canonical(name: str) -> str:
    """The dotted key an option sets, whatever its spelling: ``--model.init_args.lr`` and
    ``--model.lr`` set ``model.lr``, ``--model.class_path`` and ``--model`` set ``model``."""
    parts = name.lstrip("-").split(".")
    inner = [p for i, p in enumerate(parts) if p != "init_args" or i == len(parts) - 1]
    if len(inner) > 1 and inner[-1] == "class_path":
        inner.pop()
    return ".".join(inner)


def _parsed(name: str, text: str | None) -> Any:
    """``text`` as the YAML value it means (the text itself when it is no YAML); an inline
    mapping or list that gives a key twice is refused."""
    if text is None:
        return None
    if text.lstrip()[:1] in ("{", "["):
        check_yaml_keys(text, f"the value of {name}")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _leaves(
    name: str, key: str, given: _Setting, within: str = ""
) -> Iterator[tuple[str, _Setting]]:
    """``(dotted key, setting)`` of each value ``given`` sets: itself, or, for an inline mapping
    (``{class_path: ..., init_args: {...}}``), each of its entries (``within``: the path inside
    the option's value so far)."""
    value = given.value
    if not within and key.endswith(".init_args") and isinstance(value, dict):
        key = key.rpartition(".")[0]  # --model.init_args '{lr: 0.1}' sets model.lr
    if not isinstance(value, dict) or not value:
        yield key, given
        return
    for inner, item in value.items():
        path = key if inner in ("class_path", "init_args") else f"{key}.{inner}"
        inside = f"{within}.{inner}" if within else str(inner)
        text = item if isinstance(item, str) else json.dumps(item, default=str)
        setting = _Setting(f"{name}'s {inside}", text, item)
        yield from _leaves(name, path, setting, inside)


def _options(argv: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    """``(name, value)`` of every ``--name value``, ``--name=value`` or ``-c value`` in ``argv``
    (``None``: a flag with no value)."""
    for index, word in enumerate(argv):
        if word.startswith("--") and "=" in word:
            name, value = word.split("=", 1)
            yield name, value
        elif word.startswith("--") or word == "-c":
            following = argv[index + 1] if index + 1 < len(argv) else None
            taken = following is not None and not following.startswith("--")
            yield word, following if taken else None

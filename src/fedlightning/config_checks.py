"""One value per option: a config file or a command line that says two things is refused.

YAML parsers keep the last of two equal keys in one mapping (``rounds: 2`` then ``rounds: 3``
runs 3 rounds without a word), and argument parsers keep the last of an option given twice. The
commands (``fit``, ``cofed``, ``plot``) refuse both before parsing, naming what was said twice:

- :func:`check_yaml_keys`: a mapping with a key given twice, named by its path in the file
  (``loop.aggregator.init_args.noise_multiplier``) and both lines; read with PyYAML's public
  composer (:func:`yaml.compose`), which keeps every key of a mapping with its line;
- :func:`check_repeated_options`: an option given twice on the command line with different
  values. A config file then the command line is an override, not a repetition (``-c`` files
  may be given several times: each later one overrides, as documented), and so is an option
  given twice with one value; ``--name+=value`` appends to a list, after which the new item's
  options (``--name.option``) may be given again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import yaml

from fedlightning.errors import ConfigurationError

#: options that may repeat (config files layer, later over earlier)
REPEATABLE = frozenset({"-c", "--config"})
MERGE_TAG = "tag:yaml.org,2002:merge"


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
        raise ConfigurationError(
            f"{source} gives {key} twice (line {first} and line {second}) in one mapping, and "
            "YAML would silently keep the last: keep one of them"
        )


def _duplicates(
    node: yaml.Node | None, path: str, seen: set[int]
) -> Iterator[tuple[str, int, int]]:
    """``(key path, first line, second line)`` of each key given twice under ``node``."""
    if node is None or id(node) in seen:  # an alias of a node already walked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == MERGE_TAG:
                continue
            inner = f"{path}.{key.value}" if path else key.value
            line = key.start_mark.line + 1
            if (key.tag, key.value) in lines:
                yield inner, lines[key.tag, key.value], line
            lines.setdefault((key.tag, key.value), line)
            yield from _duplicates(value, inner, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicates(item, f"{path}[{index}]", seen)


def check_repeated_options(argv: Sequence[str]) -> None:
    """Raise a ConfigurationError when ``argv`` (a command's arguments) gives an option twice
    with different values, naming the option and both values."""
    given: dict[str, str | None] = {}
    for name, value in _options(argv):
        if name.endswith("+"):  # a new list item: its options may be given again
            item = f"{name[:-1]}."
            given = {k: v for k, v in given.items() if not k.startswith(item)}
            continue
        if name in REPEATABLE:
            continue
        if name in given and given[name] != value:
            raise ConfigurationError(
                f"{name} is given twice on the command line, as {given[name]!r} and as "
                f"{value!r}: give it once (an option in a -c file is overridden by the command "
                "line, not repeated)"
            )
        given.setdefault(name, value)


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

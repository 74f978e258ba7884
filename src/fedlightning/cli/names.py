"""A command-line or config mistake the parser finds, in one line instead of jsonargparse's report.

jsonargparse says what failed in a nested report (the option's key, the union of types tried, each
type's error, the value given); :func:`parse_error_line` reads it and answers with what was given
and what fits there, from :mod:`fedlightning.cli.catalog`:

- a class name that is not of the option's kind says where it belongs
  (``FedProx is a client objective: --model FedProx, or -c configs/fedprox.yaml``) and the closest
  names of the right kind; a class path that imports something else says what it is and what is
  expected (``mine.Max is a class derived from object, not a subclass of
  fedlightning.server.statistics.Statistic``); an unknown name or class path names the closest
  ones;
- an option the chosen class does not take names the classes of its kind that take it, or else
  the class's closest options;
- an unrecognized option names the closest options; a key of a config file that no option has
  names the first part of it that is wrong and the closest names in its place
  (``loop takes no option local_epoch; the closest: local_epochs``); a value outside a fixed set
  of choices names the choices and the closest one;
- anything else is jsonargparse's own report, folded onto one line.

A mistake in a config file starts with the file and the line of the key
(:func:`fedlightning.cli.names.key_location`).
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Sequence
from pathlib import Path

import yaml

from fedlightning.cli.catalog import Kind, kind_of_base, kinds_of
from fedlightning.cli.errors import config_arguments
from fedlightning.errors import closest, did_you_mean, what_it_is
from fedlightning.run_config import canonical_class_path

_KEY = re.compile(r'Parser key "([^"]+)":')
_BAD_NAME = re.compile(r"Expected a dot import path string: (\S+)|Expected a path but (.+?) either")
_BAD_PATH = re.compile(
    r"Problem with given class_path '([^']+)':\s*\n\s*(module '[^']+' has no attribute '[^']+'|"
    r"No module named '[^']+')"
)
_NOT_ACCEPTED = re.compile(
    r"Problem with given class_path '([^']+)':\s*\n\s*Option '([^']+)' is not accepted"
)
_NOT_SUBCLASS = re.compile(r"Import path (\S+) does not correspond to a subclass of")
_BASE = re.compile(r"Subtypes: \[(?:<class '|list\[)([\w.]+)")
_EXPECTED = re.compile(r"Expected an? (.+?)\. Got value: (.*)")
_LITERAL = re.compile(r"typing\.Literal\[(.*)\]")
_CLASS = re.compile(r"<class '([\w.]+)'>")
#: a config file's key that no option has (jsonargparse names it in full: ``lop.rounds``)
_NOT_IN_PARSER = re.compile(r"Subcommand '[\w-]+' does not accept option '([^']+)'")
#: lines of jsonargparse's report that say nothing about this mistake
_NOISE = re.compile(
    r"Subtypes:|Errors:|Given value type:|Does not validate against any of the Union|"
    r"Expected a <class 'NoneType'>"
)


def parse_error_line(message: str, options: Sequence[str] = (), given: Sequence[str] = ()) -> str:
    """One line for jsonargparse's parse error ``message``; ``options``: the parser's option
    names (``loop.rounds``...), for an unrecognized one; ``given``: the command's arguments,
    whose config files (``-c FILE``) are searched for the key, in order, unless the command line
    gives it: a key found in one is named with its file and line."""
    if unknown := _NOT_IN_PARSER.search(message):
        key, explained = _unknown_key(unknown[1], options)
    else:
        key, explained = _mistaken_key(message), _explain(message, options)
    files = [path for _, path in config_arguments(given)]
    where = key_location(key, files) if key and not _on_command_line(key, given) else None
    return f"{where[0]}, line {where[1]}: {explained}" if where else explained


def _mistaken_key(message: str) -> str | None:
    """The dotted key the parse error ``message`` is about (``model.init_args.lrr``), if any."""
    key = ".init_args.".join(_KEY.findall(message))
    if not_accepted := _NOT_ACCEPTED.search(message):
        return f"{key}.init_args.{not_accepted[2]}"
    return key or None


def _explain(message: str, options: Sequence[str]) -> str:
    keys = _KEY.findall(message)
    key = ".init_args.".join(keys)  # a nested key is inside the class of the key before it
    base = _BASE.findall(message)
    kind = kind_of_base(base[-1]) if base else None
    if message.startswith("unrecognized arguments:"):
        given = message.split(":", 1)[1].split()
        flag = next((word for word in given if word.startswith("--")), "")
        near = closest(flag.lstrip("-").split("=")[0], options)
        hint = f"; the closest: {', '.join('--' + n for n in near)}" if near else ""
        return f"{message.strip()}{hint} (fedlightning fit --help lists them)"
    if bad_path := _BAD_PATH.search(message):
        path, why = bad_path.groups()
        return (
            f"{key}: {path} cannot be imported ({why}){_closest_of(path.rsplit('.', 1)[-1], kind)}"
        )
    if (names := _BAD_NAME.findall(message)) and not _NOT_ACCEPTED.search(message):
        name = next(group for group in names[-1] if group)
        if not_subclass := _NOT_SUBCLASS.search(message):  # a class path in a YAML mapping
            name = not_subclass[1]
        misplaced = _misplaced(name.rsplit(".", 1)[-1], kind)
        return f"{key}: {misplaced or _unknown(name, kind, base[-1] if base else None)}"
    if not_accepted := _NOT_ACCEPTED.search(message):
        return f"{key}.init_args.{not_accepted[2]}: {_option_hint(*not_accepted.groups(), kind)}"
    if expected := _EXPECTED.search(message):
        value = expected[2].strip()
        if literal := _LITERAL.fullmatch(expected[1]):
            choices = [c.strip().strip("'") for c in literal[1].split(",")]
            allowed = f"choose one of {', '.join(choices)}{did_you_mean(value, choices)}"
        else:
            allowed = "expected " + _CLASS.sub(r"\1", expected[1])
        return f"{key}={value!r} is not allowed: {allowed}"
    lines = [_KEY.sub(r"\1:", line).strip().lstrip("- ") for line in message.splitlines()]
    return " ".join(line for line in lines if line and not _NOISE.match(line))


def _unknown_key(key: str, options: Sequence[str]) -> tuple[str, str]:
    """The first part of the dotted ``key`` that no option in ``options`` has (``loop.local_epoch``
    of ``loop.local_epoch``, ``lop`` of ``lop.rounds``) and the line that names it and the closest
    names the part before it takes."""
    parts = key.split(".")
    names = [option.split(".") for option in options if option not in ("config", "subcommand")]
    depth = 0
    while depth < len(parts) and any(name[: depth + 1] == parts[: depth + 1] for name in names):
        depth += 1
    if depth == len(parts):  # every part is known: jsonargparse's words are all there is
        return key, f"{key}: this key is not accepted here (fedlightning fit --help lists them)"
    parent, wrong = parts[:depth], parts[depth]
    taken = list(dict.fromkeys(n[depth] for n in names if n[:depth] == parent and len(n) > depth))
    owner = f"{'.'.join(parent)} takes no option" if parent else "no group or option is called"
    bad = ".".join(parts[: depth + 1])
    hint = did_you_mean(wrong, taken)
    return bad, f"{bad}: {owner} {wrong}{hint} (fedlightning fit --help lists them)"


def _on_command_line(key: str, given: Sequence[str]) -> bool:
    """Whether the arguments ``given`` set ``key`` or a key above it (``--model`` for
    ``model.init_args.lr``); ``init_args`` parts are ignored, as the parser allows."""
    parts = [part for part in key.split(".") if part != "init_args"]
    for word in given:
        name = word[2:].split("=", 1)[0] if word.startswith("--") else ""
        named = [part for part in name.rstrip("+").split(".") if part != "init_args"]
        if named and named == parts[: len(named)]:
            return True
    return False


def key_location(key: str, files: Sequence[str]) -> tuple[str, int] | None:
    """``(file, line)`` of the dotted ``key`` in the first of the YAML ``files`` that gives it
    (an ``init_args`` part may be left out in the file, as the parser allows), or None."""
    for file in files:
        try:
            root = yaml.compose(Path(file).read_text(), Loader=yaml.SafeLoader)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        line = _line_of(root, key.split("."))
        if line is not None:
            return file, line
    return None


def _line_of(node: yaml.Node | None, parts: list[str]) -> int | None:
    """The 1-based line of the key ``parts`` under the YAML ``node``."""
    if not parts or not isinstance(node, yaml.MappingNode):
        return None
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode) and key.value == parts[0]:
            return key.start_mark.line + 1 if len(parts) == 1 else _line_of(value, parts[1:])
    if parts[0] == "init_args":  # `model: {class_path: ..., lr: 0.1}` gives init_args unnamed
        return _line_of(node, parts[1:])
    return None


def _misplaced(name: str, kind: Kind | None) -> str | None:
    """Where ``name`` belongs when it is of another kind than the option's, with the closest
    names of the option's kind; None when it is not of another kind."""
    elsewhere = [other for other in kinds_of(name) if other is not kind]
    if not elsewhere:
        return None
    other = elsewhere[0]
    config = _config_using(other.class_path(name)) if other.base else None
    where = f"{other.option} {name}" + (f", or -c {config}" if config else "")
    return f"{name} is {_a(other.what)}: {where}{_closest_of(name, kind)}"


def _unknown(name: str, kind: Kind | None, base: str | None) -> str:
    """``name`` names no class of ``kind`` (subclasses of ``base``): what it names instead
    when it imports, else the closest names."""
    found = _import(name) if "." in name else None
    if found is not None and base is not None:
        expected = f"a subclass of {canonical_class_path(base)}"
        if kind is not None:
            expected = f"{_a(kind.what)} ({expected})"
        return f"{name} is {what_it_is(found)}, not {expected}"
    if kind is None:
        return f"{name} is not a class that can be imported: give its full class path"
    return f"no {kind.what} is called {name}{_closest_of(name, kind, own='.' not in name)}"


def _closest_of(name: str, kind: Kind | None, own: bool = False) -> str:
    """``; the closest aggregators: ... (all: fedlightning list aggregators)``; ``own``: say
    that a class of one's own is named by its class path."""
    if kind is None:
        return ""
    every = f"all: fedlightning list {kind.title}" + ("; yours: its class path" if own else "")
    near = closest(name, list(kind.entries))
    return f"; the closest {kind.title}: {', '.join(near)} ({every})" if near else f"; {every}"


def _option_hint(class_path: str, option: str, kind: Kind | None) -> str:
    """``ClientModule takes no option mu``, and the classes of ``kind`` that take it (with the
    config of the first), or the class's closest options."""
    cls = _import(class_path)
    name = class_path.rsplit(".", 1)[-1]
    taking = [
        other
        for other in (kind.entries if kind and kind.base else [])
        if other != name and option in class_options(_import(kind.class_path(other)))
    ]
    if taking:
        config = _config_using(kind.class_path(taking[0]))
        example = f"{kind.option} {taking[0]}" + (f", or -c {config}" if config else "")
        return (
            f"{name} takes no option {option}; the {kind.title} that take {option}: "
            f"{', '.join(taking)} ({example})"
        )
    own = class_options(cls) if cls is not None else []
    return f"{name} takes no option {option}{did_you_mean(option, own)}"


def class_options(cls: type | None) -> list[str]:
    """The constructor arguments of ``cls`` as the parser accepts them: its own and, through
    ``**kwargs``, those of the classes it passes them to (its bases)."""
    found: list[str] = []
    for klass in cls.__mro__ if cls is not None else ():
        if "__init__" not in vars(klass) or klass is object:
            continue
        parameters = list(inspect.signature(klass.__init__).parameters.values())[1:]
        found += [p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return list(dict.fromkeys(found))


def _import(class_path: str) -> type | None:
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _config_using(class_path: str, folder: Path = Path("configs")) -> str | None:
    """A config under ``configs/`` (of the working directory) whose ``class_path`` is
    ``class_path``: the one named after the class first."""
    if not folder.is_dir():
        return None
    name = class_path.rsplit(".", 1)[-1].lower()
    pattern = re.compile(rf"class_path:\s*{re.escape(class_path)}\s*$", re.M)
    found = [
        path
        for path in sorted(folder.glob("*.yaml"))
        if pattern.search(path.read_text(errors="replace"))
    ]
    found.sort(key=lambda path: path.stem != name)
    return str(found[0]) if found else None


def _a(what: str) -> str:
    return f"an {what}" if what[0] in "aeiou" else f"a {what}"

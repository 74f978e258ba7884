"""``fedlightning list``: the table of what configs can name (fedlightning.cli.catalog) holds exactly
the registered objectives, aggregators, attacks, backends, models and data sets, each class where
the table says and accepted by its short name; the command prints every name on a line of its own."""

import importlib
import inspect
import sys

import pytest
from jsonargparse import ArgumentParser

from fedlightning import attacks, backends, clients, privacy, server
from fedlightning.cli import main
from fedlightning.cli.catalog import KINDS, kind_named
from fedlightning.cli.fit import import_named_classes
from fedlightning.data import SOURCES
from fedlightning.models import list_models


def _class(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _exported(*packages, base):
    """The concrete subclasses of ``base`` the packages export (their ``__all__``)."""
    found = set()
    for package in packages:
        for name in package.__all__:
            value = getattr(package, name)
            if inspect.isclass(value) and issubclass(value, base) and not inspect.isabstract(value):
                found.add(name)
    return found


def test_the_table_holds_exactly_the_registries():
    registries = {
        "objectives": _exported(clients, base=clients.ClientModule),
        "aggregators": _exported(server, privacy, base=server.Aggregator),
        "attacks": _exported(attacks, base=attacks.Attack),
        "backends": _exported(backends, base=backends.Backend),
        "models": set(list_models()),
        "datasets": set(SOURCES),
    }
    assert {kind.title: set(kind.entries) for kind in KINDS} == registries
    assert all(line.strip() for kind in KINDS for line in kind.entries.values())


@pytest.mark.parametrize("kind", [k for k in KINDS if k.base], ids=lambda k: k.title)
def test_each_class_is_where_the_table_says_and_parses_by_its_short_name(kind):
    base = _class(kind.base)
    import_named_classes()  # what fedlightning fit does before it parses
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--value", type=base | None)
    for name in kind.entries:
        cls = _class(kind.class_path(name))
        assert issubclass(cls, base) and cls.__name__ == name
        parsed = parser.parse_args(["--value", name])
        assert parsed.value.class_path.rsplit(".", 1)[-1] == name


def test_list_prints_every_name_on_its_own_line(capsys):
    sys.argv = ["fedlightning"]
    with pytest.raises(SystemExit) as exit_info:
        main(["list"])
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    for kind in KINDS:
        heading = lines.index(f"{kind.title} ({kind.option} NAME):")
        section = lines[heading + 1 : heading + 1 + len(kind.entries)]
        assert [line.split()[0] for line in section] == list(kind.entries)
        assert all(line.split(maxsplit=1)[1] in kind.entries.values() for line in section)


def test_list_takes_a_kind_and_refuses_another_word_in_one_line(capsys):
    sys.argv = ["fedlightning"]
    with pytest.raises(SystemExit) as exit_info:
        main(["list", "backend"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and out.startswith("backends (--loop.backend NAME):")
    assert "objectives" not in out and len(out.splitlines()) == 1 + len(
        kind_named("backends").entries
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["list", "agregators"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "fedlightning list agregators: no such kind; the closest: aggregators" in err

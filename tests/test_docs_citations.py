"""Docs that cannot drift (issue 22 item 7): every citation of docs/algorithms.md in the sources,
tests, configs, scripts, notebooks and the README names a section that exists, and a quoted title
after it (``section 2.1, "Accumulation"``) is that section's heading or a sub-heading inside it: a
nested heading, or a bold or italic run-in heading (``**Tabular variant**``,
``- *Accumulation.*``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "algorithms.md"
HEADING = re.compile(r"^(#{2,4}) (\d+(?:\.\d+)*)\.? (.+)$")
RUN_IN = re.compile(r"^\s*(?:- )?(?:\*\*(.+?)\*\*|\*([^*\s][^*]*?)\*(?!\*))")
NUMBER = r"\d+(?:\.\d+)*"
CITATION = re.compile(
    rf"docs/algorithms\.md,?\s+(?:sections?\s+)?({NUMBER}(?:\s*(?:,|and)\s*{NUMBER})*)"
    r"(?:[,;:]?\s*[\"“]([^\"”]+)[\"”])?"
)
#: where citations live: (folder or file, glob)
SOURCES = [
    ("src", "**/*.py"), ("tests", "**/*.py"), ("configs", "**/*.yaml"), ("experiments", "*.py"),
    ("benchmarks", "**/*.py"), ("notebooks", "*.ipynb"), ("README.md", ""),
]  # fmt: skip


def _titles(title: str) -> set[str]:
    """A heading's title as it may be quoted: without a trailing period or colon, and also
    without a trailing parenthetical (``InCo (internal cross-layer gradients)`` -> ``InCo``)."""
    title = title.strip().rstrip(".:").strip()
    return {title, re.sub(r"\s*\(.*\)$", "", title)}


def doc_sections(text: str) -> dict[str, set[str]]:
    """Section number -> the titles it may be cited under: its own heading's, and those of every
    heading and run-in heading inside it (down to the next heading of its level or above)."""
    lines = text.splitlines()
    heads = [(i, *m.groups()) for i, line in enumerate(lines) if (m := HEADING.match(line))]
    sections: dict[str, set[str]] = {}
    for index, (start, level, number, title) in enumerate(heads):
        end = next((s for s, lv, _, _ in heads[index + 1 :] if len(lv) <= len(level)), len(lines))
        titles = _titles(title)
        for line in lines[start + 1 : end]:
            if nested := HEADING.match(line):
                titles |= _titles(nested.group(3))
            elif run_in := RUN_IN.match(line):
                titles |= _titles(run_in.group(1) or run_in.group(2))
        sections[number] = titles
    return sections


def words(raw: str) -> str:
    """Text as one line of words, comment markers at line starts dropped: a citation may continue
    on the next comment or docstring line."""
    return " ".join(re.sub(r"^\s*#+", "", line).strip() for line in raw.splitlines())


def prose(path: Path) -> str:
    """A file's :func:`words` (a notebook's: its cells' sources joined)."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return words("\n".join("".join(cell["source"]) for cell in cells))
    return words(path.read_text())


def citations(text: str) -> list[tuple[list[str], str | None, str]]:
    """``(section numbers, quoted title or None, the citation as written)`` for each citation."""
    return [
        (re.findall(NUMBER, m.group(1)), m.group(2), m.group(0)) for m in CITATION.finditer(text)
    ]


def problems(text: str, sections: dict[str, set[str]]) -> list[str]:
    found = []
    for numbers, title, written in citations(text):
        missing = [n for n in numbers if n not in sections]
        if missing:
            found.append(f"{written!r}: no section {', '.join(missing)}")
        elif title is not None and not any(title in sections[n] for n in numbers):
            found.append(f"{written!r}: no heading {title!r} in section {' or '.join(numbers)}")
    return found


def cited_files() -> list[Path]:
    files = []
    for folder, pattern in SOURCES:
        base = ROOT / folder
        files += [base] if not pattern else sorted(base.glob(pattern))
    return [f for f in files if f.resolve() != Path(__file__).resolve()]


def test_every_citation_names_an_existing_section_and_title():
    sections = doc_sections(DOC.read_text())
    assert {"1.4", "1.6", "2.1", "2.5.1", "3", "6"} <= set(sections)
    report, count, titled = [], 0, 0
    for path in cited_files():
        text = prose(path)
        count += len(citations(text))
        titled += sum(title is not None for _, title, _ in citations(text))
        report += [f"{path.relative_to(ROOT)}: {p}" for p in problems(text, sections)]
    assert not report, "\n".join(report)
    assert count >= 60 and titled >= 3  # the scan does find the repository's citations


def test_the_check_fails_on_a_wrong_number_or_a_wrong_title():
    sections = doc_sections(DOC.read_text())
    good = [
        'see docs/algorithms.md section 2.1, "Where and how exactly the server computes").',
        'docs/algorithms.md section 2.1, "Accumulation"',
        '# (docs/algorithms.md\n# section 3, "Tabular variant")',
        "docs/algorithms.md sections 1.3 and 2.3): MOON within groups",
        'docs/algorithms.md 2.4, "InCo"',
        'docs/algorithms.md section 1.6, "CNN1 and CNN2"',
    ]
    for text in good:
        assert citations(words(text)) and problems(words(text), sections) == [], text
    bad = [
        "docs/algorithms.md section 2.99",  # no such section
        "docs/algorithms.md sections 1.4 and 97",  # no section 97
        'docs/algorithms.md section 2.2, "Accumulation"',  # a title of section 2.1
        'docs/algorithms.md section 2.1, "Acumulation"',  # misspelt
        'docs/algorithms.md sections 3 and 4, "label_spaces"',  # a spec term, not a heading
    ]
    for text in bad:
        assert len(problems(words(text), sections)) == 1, text

"""What no command may print to a user's stderr: a third-party warning (issue 38 item 3).

A Python warning, printed as ``FILE.py:LINE: Category: message`` (Lightning's as ``FILE.py:LINE:
message``), a ``...Warning`` named anywhere, a logging record at level WARNING, or a C++ warning
of torch (``[W... file.cpp:LINE]``). fedlightning's own lines (the progress, the backend chosen,
the summary) are none of these.
"""

import re

THIRD_PARTY_WARNING = re.compile(
    r"^\s*\S+\.py:\d+: |\b[A-Z]\w*Warning\b|\bWARNING\b|^\[W\d+ |site-packages/", re.M
)


def third_party_warnings(stderr: str) -> list[str]:
    """The lines of ``stderr`` that are a third-party warning (or part of one)."""
    return [line for line in stderr.splitlines() if THIRD_PARTY_WARNING.search(line)]

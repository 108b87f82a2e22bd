"""The shape both commands' reports share: a label, then its value from one column on,
so that a reader's eye (and a script's split on two spaces) finds the values.
"""

from __future__ import annotations

from typing import Any

WIDTH = 18  # the column where values start


def line(label: str, value: Any) -> str:
    return f"{label:<{WIDTH - 1}} {value}"

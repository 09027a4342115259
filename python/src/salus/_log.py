"""One line on stderr from the adapter, which must never break the user's program."""

from __future__ import annotations

import sys


def warn(msg: str) -> None:
    try:
        sys.stderr.write(f"salus: {msg}\n")
        sys.stderr.flush()
    except Exception:
        pass

"""The build checks scripts/test.sh runs beside pytest (the fuzz targets' build and their seeds, then the book's
check and build, scripts/build_docs.sh): this test, moved to the end of the session by conftest.py, waits for them and fails with their
output if one failed. Skipped when pytest runs without scripts/test.sh (no SALUS_CI_BACKGROUND)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import wait_until

BACKGROUND = os.environ.get("SALUS_CI_BACKGROUND", "")
# Under load the checks take a few minutes; the suite before this test takes longer.
LIMIT_S = 30 * 60


@pytest.mark.skipif(not BACKGROUND, reason="pytest was not started by scripts/test.sh")
def test_fuzz_build_and_seeds_passed():
    rc = Path(BACKGROUND) / "rc"
    assert wait_until(rc.exists, timeout=LIMIT_S, interval=1.0), f"the background build checks ran past {LIMIT_S} s"
    log = (Path(BACKGROUND) / "log").read_text(errors="replace")
    assert rc.read_text().strip() == "0", f"a background build check failed:\n{log[-8000:]}"

"""The browser client's own tests (node's built-in runner), run as part of the suite."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

JS = Path(__file__).resolve().parents[2] / "clients" / "js"


def test_transcript_model_node_tests_pass():
    node = shutil.which("node")
    assert node, "node (>= 20) is needed for the browser client's tests"
    done = subprocess.run([node, "--test", "test/"], cwd=JS, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = int(re.search(r"^# pass (\d+)", done.stdout, re.MULTILINE).group(1))
    assert passed >= 7 and "# fail 0" in done.stdout, done.stdout[-2000:]

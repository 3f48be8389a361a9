"""The code stays in small pieces: no function in asr_server/ over 50 lines (STYLE.md, "small functions")."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "asr_server"
LIMIT = 50
# Declarative tables, not logic: one line per metric.
EXEMPT = {("metrics.py", "__init__")}


def test_no_function_is_longer_than_the_limit():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (path.name, node.name) not in EXEMPT:
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over the limit:\n" + "\n".join(long)


def test_only_the_engine_modules_import_faster_whisper():
    allowed = {"inference/fw.py", "inference/models.py"}
    found = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if "faster_whisper" in text.replace("faster-whisper", "") and ("import faster_whisper" in text or "from faster_whisper" in text):
            found.add(str(path.relative_to(PACKAGE)))
    assert found <= allowed, found - allowed

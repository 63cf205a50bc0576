"""The simulator example of docs/python.md runs as written and prints what the text says."""
import contextlib
import io
import os

import pytest

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")


def first_program():
    text = open(DOC).read()
    start = text.index("```python", text.index("## A first program")) + len("```python\n")
    return text[start:text.index("```", start)]


@pytest.mark.skipif(not os.path.exists(DOC), reason="docs/ is not beside the tests (installed elsewhere)")
def test_the_first_program_of_the_python_docs_runs_and_replays():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(first_program(), "docs/python.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[3] == "3 [6. 6. 6. 6. 6. 6. 6. 6.]"
    assert lines[4] == "2"  # replays
    assert "RECORDED" in out.getvalue()

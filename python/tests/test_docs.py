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


TORCH_DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "torch.md")


@pytest.mark.skipif(not os.path.exists(TORCH_DOC), reason="docs/ is not beside the tests (installed elsewhere)")
def test_every_test_docs_torch_md_cites_exists():
    """docs/torch.md backs each promise with a test by name: each name it
    cites is a test function in python/tests or in the C suites (test/)."""
    import glob
    import re

    cited = set(re.findall(r"`(test_[a-z0-9_]+)`", open(TORCH_DOC).read()))
    assert len(cited) >= 20
    defined = set()
    for path in glob.glob(os.path.join(os.path.dirname(__file__), "test_*.py")):
        defined |= set(re.findall(r"^def (test_[a-z0-9_]+)\(", open(path).read(), re.M))
    for path in glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "test", "*.c")):
        defined |= set(re.findall(r"^static void (test_[a-z0-9_]+)\(void \*\*state\)", open(path).read(), re.M))
    assert sorted(cited - defined) == []

"""The README example runs as written."""

import pathlib
import re


def test_readme_example_runs(capsys):
    text = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) <= 24
    exec(compile(code, "README.md", "exec"), {})
    assert "held by" in capsys.readouterr().out

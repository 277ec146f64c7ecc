"""The README examples run as written."""

import pathlib
import re
import subprocess
import sys

BLOCKS = re.findall(
    r"```python\n(.*?)```", (pathlib.Path(__file__).parent.parent / "README.md").read_text(), re.S
)


def test_readme_example_runs(capsys):
    code = BLOCKS[0]
    assert len(code.strip().splitlines()) <= 24
    exec(compile(code, "README.md", "exec"), {})
    assert "held by" in capsys.readouterr().out


def test_readme_runtime_example_runs(tmp_path):
    script = tmp_path / "readme_runtime.py"
    script.write_text(BLOCKS[1])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]

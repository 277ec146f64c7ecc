"""The documentation runs as written: every code block of README.md and docs/*.md.

The rules (README.md, "Documentation", says the same in short):

* A ```python block is a program. It runs as written: saved as ``snippet.py`` in a fresh
  temporary directory, run there with this interpreter (the venv's python), and it must exit 0
  within :data:`TIMEOUT_S` seconds. Nothing is added to it and nothing is skipped.
* A marker on the line right above a block's opening fence says how else to run it:
  ``<!-- doctest: OPTIONS -->``, options separated by commas:

  - ``continue``: the block continues the page's previous ```python block; the two (a chain of
    any length) run as one program, the blocks joined in page order. Write it where a page
    explains a program in parts.
  - ``torchrun N``: the program runs as a script under ``torchrun --standalone
    --nproc-per-node N`` (every rank must exit 0).
  - ``root``: the program needs root and network namespaces (an emulated cluster,
    docs/cluster.md). Elsewhere it is skipped with :func:`meshcast.cluster.available`'s reason.
  - ``timeout S``: allow S seconds instead of :data:`TIMEOUT_S`.
  - ``run`` (on a ```sh block only): the block runs with ``bash -e`` in a fresh temporary
    directory where ``.venv`` is this venv and its ``bin`` comes first on ``PATH``.

* Code that is not a program (an excerpt, signatures, a transcript, program output) is fenced as
  ```text (or plain ```); shell commands are fenced as ```sh.
* Every line of every block may not use ``sudo`` (the commands are written for root: "run as
  root"), and every ``meshcast ...`` command of a ```sh block (``[...]`` optional parts included)
  must parse with the CLI's own parser, so a renamed flag breaks the docs' test.

A marker that is misspelt, or stands above anything but a ```python or ```sh block, fails the
test, and so does a python block under another name (```py, ```python3): no python block can go
unrun.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from meshcast.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 300
"""Default seconds a documented program may take (multi-process snippets on a loaded 2-core
machine take 20-60 s)."""

FENCE = re.compile(r"^(`{3,})([^`\s]*)[^`]*$")
MARKER = re.compile(r"^<!--\s*doctest:(.*?)-->\s*$")
SHELL_LANGS = ("sh", "bash", "shell", "console")


@dataclass
class Block:
    """One fenced block of a page."""

    page: pathlib.Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{_name(self.page)}:{self.line}"


def _name(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def _options(marker: str, where: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in (x.strip() for x in marker.split(",")):
        name, _, value = item.partition(" ")
        value = value.strip()
        if name in ("continue", "root", "run") and not value:
            options[name] = ""
        elif name in ("torchrun", "timeout") and value.isdigit() and int(value) > 0:
            options[name] = value
        else:
            raise ValueError(f"{where}: unknown doctest option {item!r} (see tests/test_docs.py)")
    return options


def parse_page(page: pathlib.Path) -> list[Block]:
    """The fenced blocks of ``page``, with the options of their markers."""
    blocks: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        ticks, lang, start = m.group(1), m.group(2), i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == ticks), None)
        if end is None:
            raise ValueError(f"{_name(page)}:{i + 1}: code block never closed")
        where = f"{_name(page)}:{start + 1}"
        marker = MARKER.match(lines[start - 1].strip()) if start else None
        options = _options(marker.group(1), where) if marker else {}
        blocks.append(Block(page, start + 1, lang, "\n".join(lines[start + 1:end]) + "\n",
                            options))
        i = end + 1
    for n, text in enumerate(lines):  # a marker must stand right above a block's fence
        if MARKER.match(text.strip()) and not (n + 1 < len(lines) and FENCE.match(lines[n + 1])):
            raise ValueError(f"{_name(page)}:{n + 1}: doctest marker not right above a code block")
    return blocks


def _check_block(block: Block) -> None:
    if block.lang in ("py", "python3", "Python", "ipython"):
        raise ValueError(f"{block.where}: fence python code as ```python (it is run) or ```text")
    if block.options and block.lang not in ("python", *SHELL_LANGS):
        raise ValueError(f"{block.where}: a doctest marker goes above ```python or ```sh only")
    if "run" in block.options and block.lang not in SHELL_LANGS:
        raise ValueError(f"{block.where}: 'run' is for ```sh blocks; python blocks always run")
    if block.lang in SHELL_LANGS and set(block.options) - {"run", "root", "timeout"}:
        raise ValueError(f"{block.where}: a ```sh block takes run, root, timeout only")
    if block.options.get("continue") is not None and "torchrun" in block.options:
        raise ValueError(f"{block.where}: put torchrun on the first block of a chain")


@dataclass
class Program:
    """One or more ```python blocks that run as one program."""

    blocks: list[Block]

    @property
    def where(self) -> str:
        return self.blocks[0].where + "".join(f"+{b.line}" for b in self.blocks[1:])

    @property
    def text(self) -> str:
        return "\n".join(b.text for b in self.blocks)

    def option(self, name: str) -> str | None:
        for b in self.blocks:
            if name in b.options:
                return b.options[name]
        return None


def collect(pages: list[pathlib.Path]) -> tuple[list[Program], list[Block], list[Block]]:
    """(python programs, ```sh blocks marked run, every block) of ``pages``."""
    programs: list[Program] = []
    shell_runs: list[Block] = []
    every: list[Block] = []
    for page in pages:
        previous: Program | None = None
        for block in parse_page(page):
            _check_block(block)
            every.append(block)
            if block.lang == "python":
                if "continue" in block.options:
                    if previous is None:
                        raise ValueError(f"{block.where}: 'continue' without a python block above")
                    previous.blocks.append(block)
                else:
                    previous = Program([block])
                    programs.append(previous)
            elif "run" in block.options:
                shell_runs.append(block)
    return programs, shell_runs, every


PROGRAMS, SHELL_RUNS, BLOCKS = collect(PAGES)


def _skip_unless_root(option: str | None) -> None:
    if option is not None:
        from meshcast.cluster import available

        ok, why = available()
        if not ok:
            pytest.skip(f"needs root and network namespaces: {why}")


def _env() -> dict[str, str]:
    venv_bin = os.path.dirname(sys.executable)
    return {**os.environ, "MPLBACKEND": "Agg", "PATH": venv_bin + os.pathsep + os.environ["PATH"]}


def _show(done: subprocess.CompletedProcess) -> str:
    return f"exit status {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n" \
           f"{done.stderr[-6000:]}"


def run_program(program: Program, tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    """Run ``program`` as its markers say (see the module docstring)."""
    script = tmp_path / "snippet.py"
    script.write_text(program.text)
    timeout = int(program.option("timeout") or TIMEOUT_S)
    nproc = program.option("torchrun")
    if nproc is None:
        argv = [sys.executable, str(script)]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}", str(script)]
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env=_env())


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.where for p in PROGRAMS])
def test_python_block_runs(program: Program, tmp_path: pathlib.Path) -> None:
    _skip_unless_root(program.option("root"))
    done = run_program(program, tmp_path)
    assert done.returncode == 0, f"{program.where} failed:\n{_show(done)}"


@pytest.mark.parametrize("block", SHELL_RUNS, ids=[b.where for b in SHELL_RUNS])
def test_shell_block_runs(block: Block, tmp_path: pathlib.Path) -> None:
    _skip_unless_root(block.options.get("root"))
    (tmp_path / ".venv").symlink_to(sys.prefix)
    timeout = int(block.options.get("timeout") or TIMEOUT_S)
    done = subprocess.run(["bash", "-e", "-c", block.text], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout, env=_env())
    assert done.returncode == 0, f"{block.where} failed:\n{_show(done)}"


def test_every_python_block_is_run() -> None:
    """Every ```python block of every page belongs to exactly one program run above."""
    python = [b for b in BLOCKS if b.lang == "python"]
    in_programs = [b for p in PROGRAMS for b in p.blocks]
    assert python and sorted(map(id, python)) == sorted(map(id, in_programs))
    assert {p.page.name for p in in_programs} >= {"README.md", "pipeline.md", "weight-sync.md"}


def test_no_sudo_in_the_docs() -> None:
    """Doc commands are written for root without sudo (a root machine may not have it)."""
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in PAGES
           for n, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"\bsudo\b", line)]
    assert not bad, f"sudo in {bad}: write the command alone and say 'run as root'"


def _command_lines(text: str) -> list[str]:
    """Shell command lines of a block (continuations joined, comments dropped)."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            out.append(line)
    return out


def _meshcast_argv(line: str) -> list[str] | None:
    words = shlex.split(line.replace("[", " ").replace("]", " "))
    while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value prefixes
        words.pop(0)
    if words and os.path.basename(words[0]) == "meshcast":
        return words[1:]
    return None


def test_meshcast_commands_in_the_docs_parse() -> None:
    """Every `meshcast ...` command of a ```sh block is accepted by the CLI's parser."""
    parser = build_parser()
    seen = 0
    for block in BLOCKS:
        if block.lang not in SHELL_LANGS:
            continue
        for line in _command_lines(block.text):
            argv = _meshcast_argv(line)
            if argv is None:
                continue
            seen += 1
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
                parser.parse_args(argv)
            assert not err.getvalue(), f"{block.where}: `{line}`: {err.getvalue()}"
    assert seen >= 10


def test_readme_example_is_short() -> None:
    """The first README example stays a screenful (24 lines)."""
    first = next(p for p in PROGRAMS if p.blocks[0].page.name == "README.md")
    assert len(first.text.strip().splitlines()) <= 24


def test_runner_rules(tmp_path: pathlib.Path) -> None:
    """The runner refuses what it cannot run as the rules say."""
    page = tmp_path / "page.md"
    cases = {
        "<!-- doctest: skip -->\n```python\nx = 1\n```\n": "unknown doctest option",
        "<!-- doctest: root -->\n\n```python\nx = 1\n```\n": "not right above",
        "<!-- doctest: root -->\n```text\nx\n```\n": "```python or ```sh only",
        "```py\nx = 1\n```\n": "fence python code as ```python",
        "<!-- doctest: run -->\n```python\nx = 1\n```\n": "'run' is for ```sh",
        "```python\nx = 1\n": "never closed",
    }
    for text, message in cases.items():
        page.write_text(text)
        with pytest.raises(ValueError, match=re.escape(message)):
            for block in parse_page(page):
                _check_block(block)
    assert shutil.which("bash")


RULES_PAGE = """\
A chain: the second block continues the first.

```python
import os
x = 41
```

<!-- doctest: continue -->
```python
assert x + 1 == 42, "the blocks run as one program"
print("ran in", os.getcwd())
```

A block alone, then a script under torchrun:

```python
assert "x" not in globals(), "a block without the marker is a program of its own"
```

<!-- doctest: torchrun 2, timeout 200 -->
```python
import torch.distributed as dist

dist.init_process_group("gloo")
assert dist.get_world_size() == 2
dist.barrier()
dist.destroy_process_group()
```
"""


@pytest.mark.timeout(400)
def test_runner_runs_chains_alone_and_under_torchrun(tmp_path: pathlib.Path) -> None:
    """The runner itself: a continued chain is one program, an unmarked block another, and a
    torchrun block runs on 2 ranks (all really run)."""
    page = tmp_path / "page.md"
    page.write_text(RULES_PAGE)
    programs, _, blocks = collect([page])
    assert [len(p.blocks) for p in programs] == [2, 1, 1] and len(blocks) == 4
    assert programs[2].option("torchrun") == "2" and programs[2].option("timeout") == "200"
    for k, program in enumerate(programs):
        work = tmp_path / f"p{k}"
        work.mkdir()
        done = run_program(program, work)
        assert done.returncode == 0, _show(done)
    assert "ran in" in run_program(programs[0], tmp_path).stdout

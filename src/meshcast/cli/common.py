"""Helpers shared by the command-line tools: argument types that check their rule, the one-line
error of a bad argument, and progress reporting on stderr.

A bad command-line argument is reported as one line on stderr naming the flag and its rule, exit
status 2, never a traceback: argument types here raise :class:`argparse.ArgumentTypeError`, checks
that involve several flags raise :class:`UsageError`. Any other exception is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

from ..core.mesh import MAX_MESH_RANKS
from ..core.task import ReshardTask
from ..core.topology import PRESETS, Topology, preset_links

__all__ = [
    "ArgumentParser",
    "UsageError",
    "choice",
    "comma_list",
    "dtype_arg",
    "integer",
    "layout_arg",
    "number",
    "numbers",
    "output_dir",
    "output_file",
    "progress",
    "shape_arg",
    "topology_for",
    "topology_spec",
    "working",
]


class UsageError(ValueError):
    """A bad command-line argument found by a command (e.g. two flags that do not go together):
    ``meshcast`` prints its message as one line and exits with status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error: ``meshcast plan: error: argument --shape: ...`` on stderr,
    exit status 2 (no usage block: ``--help`` shows it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -- argument types -------------------------------------------------------------------------------
def _fail(rule: str, text: str) -> NoReturn:
    raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")


def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An integer argument within ``[minimum, maximum]`` (either end open when None)."""
    rule = "must be an integer"
    if minimum is not None and maximum is not None:
        rule += f" from {minimum} to {maximum}"
    elif minimum is not None:
        rule += f" >= {minimum}"
    elif maximum is not None:
        rule += f" <= {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            _fail(rule, text)
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            _fail(rule, text)
        return value

    parse.__name__ = "integer"
    return parse


def number(minimum: float = 0.0, *, strict: bool = True) -> Callable[[str], float]:
    """A finite number ``> minimum`` (``strict``) or ``>= minimum``."""
    rule = f"must be a number {'>' if strict else '>='} {minimum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            _fail(rule, text)
        if not (value > minimum if strict else value >= minimum) or value == float("inf"):
            _fail(rule, text)
        return value

    parse.__name__ = "number"
    return parse


def numbers(minimum: float = 0.0, *, strict: bool = True) -> Callable[[str], list[float]]:
    """A comma-separated, non-empty list of numbers, each as :func:`number` checks it."""
    one = number(minimum, strict=strict)

    def parse(text: str) -> list[float]:
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or not all(parts):
            _fail("must be numbers separated by commas", text)
        try:
            return [one(p) for p in parts]
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"each value {exc}") from None

    parse.__name__ = "numbers"
    return parse


def choice(options: Sequence[str]) -> Callable[[str], str]:
    """One of ``options`` (the message lists them)."""

    def parse(text: str) -> str:
        if text not in options:
            raise argparse.ArgumentTypeError(
                f"{text!r} is unknown; choose one of {', '.join(options)}"
            )
        return text

    parse.__name__ = "choice"
    return parse


def comma_list(options: Sequence[str]) -> Callable[[str], list[str]]:
    """A non-empty comma-separated list of ``options``."""

    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            _fail(f"must name at least one of {', '.join(options)}", text)
        for item in items:
            if item not in options:
                raise argparse.ArgumentTypeError(
                    f"{item!r} is unknown; choose from {', '.join(options)}"
                )
        return items

    parse.__name__ = "comma_list"
    return parse


MAX_DIM = 2**63 - 1
"""The largest size of one dimension on the command line (int64, as numpy and torch count)."""


def shape_arg(text: str) -> tuple[int, ...]:
    """``"1024,1024,512"`` -> (1024, 1024, 512): sizes >= 0 separated by commas; ``""`` (or
    ``"()"``) is a 0-d tensor's shape."""
    if text.strip() in ("", "()"):
        return ()
    try:
        shape = tuple(int(s) for s in text.split(","))
    except ValueError:
        _fail("must be integers >= 0 separated by commas, e.g. 1024,1024,512", text)
    if any(s < 0 for s in shape):
        _fail("must be integers >= 0 separated by commas, e.g. 1024,1024,512", text)
    if any(s > MAX_DIM for s in shape):
        _fail(f"each size must be at most 2**63 - 1 ({MAX_DIM})", text)
    return shape


def dtype_arg(text: str) -> str:
    """An element type name meshcast knows (``float32``, ``bfloat16``, ...)."""
    from ..core.dtypes import dtype_name

    try:
        return dtype_name(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("dtype=", "", 1)) from None


def layout_arg(text: str):
    """A layout in the notation ``SHAPE[@FIRST]:SPEC`` (``2x4@8:RRS0``)."""
    from ..core.layout import Layout

    try:
        return Layout.parse(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def topology_spec(text: str) -> str:
    """``--topology``: a preset name or ``uniform:D`` with 1 <= D <= :data:`MAX_MESH_RANKS`
    devices per host (a host is built rank by rank: a larger D took minutes or all memory)."""
    if text.startswith("uniform:"):
        integer(1, MAX_MESH_RANKS)(text.split(":", 1)[1])  # raises with the rule
        return text
    if text in PRESETS:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is unknown; give a preset ({', '.join(PRESETS)}) or uniform:D (D devices per "
        "host, D >= 1)"
    )


def topology_for(spec: str | None, task: ReshardTask) -> Topology | None:
    """The topology of a ``--topology`` value (see :func:`topology_spec`) covering every rank of
    ``task``; None without one (the planner's convention: the last mesh axis is one host)."""
    if spec is None:
        return None
    if spec.startswith("uniform:"):
        per_host, links = int(spec.split(":", 1)[1]), {}
    else:
        per_host, links = PRESETS[spec][0], preset_links(spec)
    # the hosts of consecutive ranks that hold a rank of the task (not every host below its
    # highest rank: a mesh at rank 10^6 needs two hosts, not 250,000)
    used = sorted({r // per_host for r in (*task.src.mesh.devices, *task.dst.mesh.devices)})
    return Topology(tuple(tuple(range(h * per_host, (h + 1) * per_host)) for h in used),
                    **links)


IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")
"""File types ``--timeline`` can write (matplotlib's formats)."""


def output_file(suffixes: Sequence[str] = IMAGE_SUFFIXES) -> Callable[[str], str]:
    """A file to write later: its folder must exist and be writable, its name end in one of
    ``suffixes``. Checked when the arguments are parsed, before any work is done."""

    def parse(text: str) -> str:
        if not text.lower().endswith(tuple(suffixes)):
            _fail(f"must end in one of {', '.join(suffixes)}", text)
        folder = os.path.dirname(os.path.abspath(text))
        if not os.path.isdir(folder):
            _fail(f"must be in a folder that exists ({folder} does not)", text)
        if not os.access(folder, os.W_OK):
            _fail(f"must be in a writable folder ({folder} is not)", text)
        if os.path.isdir(text):
            _fail("must be a file name, not a folder", text)
        return text

    parse.__name__ = "output_file"
    return parse


def output_dir(text: str) -> str:
    """A folder to write into: it exists and is writable, or its nearest existing parent is a
    writable folder (it is created later)."""
    path = os.path.abspath(text)
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        _fail(f"must be a folder ({probe} is a file)", text)
    if not os.access(probe, os.W_OK):
        _fail(f"must be a writable folder ({probe} is not writable)", text)
    return text


# -- progress on stderr ---------------------------------------------------------------------------
QUIET_S = 2.0
"""Without a terminal, nothing is printed for work that ends within this many seconds."""
PERIOD_S = 5.0
"""Seconds between progress lines when stderr is not a terminal."""
PROGRESS_ENV = "MESHCAST_PROGRESS_S"
"""Environment variable: seconds to use for both :data:`QUIET_S` and :data:`PERIOD_S` (``0``: a
line at every step), e.g. for logs."""


def _periods() -> tuple[float, float]:
    text = os.environ.get(PROGRESS_ENV)
    if text is None:
        return QUIET_S, PERIOD_S
    try:
        value = max(0.0, float(text))
    except ValueError:
        raise UsageError(f"${PROGRESS_ENV}={text!r} must be a number of seconds") from None
    return value, value


def _line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """Report progress of ``total`` steps on stderr; yields ``advance(n=1)``.

    On a terminal: a rich progress bar (gone when done). Otherwise, once the work has taken
    :data:`QUIET_S` seconds, a line every :data:`PERIOD_S` seconds and one at the end
    (``description: 12/40 in 7 s``).
    """
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(task, n)
        return
    quiet, period = _periods()
    start = time.monotonic()
    state = {"done": 0, "next": start + quiet, "printed": False}

    def advance(n: int = 1) -> None:
        state["done"] += n
        now = time.monotonic()
        if now >= state["next"]:
            state["next"], state["printed"] = now + period, True
            _line(f"{description}: {state['done']}/{total} in {now - start:.0f} s")

    yield advance
    if state["printed"]:
        _line(f"{description}: {state['done']}/{total} in {time.monotonic() - start:.0f} s, done")


@contextmanager
def working(description: str) -> Iterator[None]:
    """Say on stderr that ``description`` is running, and for how long, until the block ends: a
    rich spinner on a terminal (gone when done); otherwise, once it has taken :data:`QUIET_S`
    seconds, a line every :data:`PERIOD_S` seconds and one at the end."""
    import threading

    if sys.stderr.isatty():
        from rich.console import Console

        with Console(stderr=True).status(description):
            yield
        return
    quiet, period = _periods()
    start = time.monotonic()
    stop = threading.Event()
    printed = threading.Event()

    def beat() -> None:
        wait = quiet
        while not stop.wait(wait):
            printed.set()
            _line(f"{description}: running for {time.monotonic() - start:.0f} s")
            wait = max(period, 0.5)

    thread = threading.Thread(target=beat, name="meshcast-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if printed.is_set():
            _line(f"{description}: done in {time.monotonic() - start:.0f} s")

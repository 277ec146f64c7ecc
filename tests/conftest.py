import compileall
import os
import sys
from pathlib import Path

from hypothesis import settings

import meshcast

sys.path.insert(0, os.path.dirname(__file__))

# Byte-compile meshcast and these test modules once: every rank process of the suite (hundreds of
# them) imports both, and with PYTHONDONTWRITEBYTECODE set nothing writes .pyc files, so each rank
# compiled every module again (about a second of CPU per rank). Existing .pyc files are read
# whatever that variable says; compileall skips the ones that are up to date.
compileall.compile_dir(str(Path(meshcast.__file__).parent), quiet=1)
compileall.compile_dir(os.path.dirname(__file__), maxlevels=0, quiet=1)

settings.register_profile("default", max_examples=150, deadline=None)
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")

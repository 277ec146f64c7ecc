import os
import sys

from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile("default", max_examples=150, deadline=None)
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")

import sys
from pathlib import Path

# tests/golden.py and other helpers are imported by name from the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import os

from hypothesis import settings

# CI must be reproducible: the same examples every run (a random example that finds a bug
# locally is then added as a regular test). Local runs explore new examples each time.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

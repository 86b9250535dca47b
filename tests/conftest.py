import sys
from pathlib import Path

# tests/golden.py and other helpers are imported by name from the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))

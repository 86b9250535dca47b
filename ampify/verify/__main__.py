"""`python -m ampify.verify ...` is the same as `ampify verify ...`."""
import sys

from ampify.verify.cli import main

if __name__ == "__main__":
    sys.exit(main())

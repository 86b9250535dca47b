"""`python -m ampify` is the same as the `ampify` command."""

from ampify.cli import main

if __name__ == "__main__":
    main()

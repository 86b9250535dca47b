"""The LibCST transforms, one per file. Installed as `ampify.transforms`.

A transform knows nothing about files, processes or the terminal: a parsed module in,
a new module plus findings out.
"""

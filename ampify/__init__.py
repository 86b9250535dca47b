"""ampify: rewrite training scripts so that they train in automatic mixed precision."""

__version__ = "0.1.0"

"""Migrations of deprecated mixed precision code to the current APIs."""

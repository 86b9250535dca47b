"""Probe modules put on the verified script's path; they must import nothing from ampify."""

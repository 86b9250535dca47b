"""The parse-only floor: read each listed file and `libcst.parse_module` it, nothing else.

Run with the same worker count as ampify, on just the files ampify had to parse, so that the
difference is what ampify adds on top of LibCST's parser (screen, imports, transforms, compile
check). It collects garbage as ampify's runner does (`GC_THRESHOLD`), so the floor gets the
same head start.
Usage: python bench/parse_only.py -j N FILE_LIST   (FILE_LIST: one path a line)
Prints one JSON line: {"files": n, "parsed": n, "failed": n}.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys

import libcst as cst

from ampify.runner import fewer_gc_passes


def parse_one(path: str) -> bool:
    """True when LibCST parsed the file."""
    try:
        with open(path, "rb") as handle:
            cst.parse_module(handle.read())
        return True
    except Exception:  # noqa: BLE001 - a floor measurement only counts failures
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=1)
    parser.add_argument("file_list")
    args = parser.parse_args(argv)
    with open(args.file_list, encoding="utf-8") as handle:
        paths = [line.rstrip("\n") for line in handle if line.strip()]
    with fewer_gc_passes():  # forked workers inherit the setting
        if args.jobs <= 1 or len(paths) < 2:
            outcomes = [parse_one(p) for p in paths]
        else:
            # Same pool shape as ampify's runner: forked once, chunked, unordered.
            chunksize = max(1, min(32, len(paths) // (args.jobs * 8)))
            with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
                outcomes = list(pool.imap_unordered(parse_one, paths, chunksize=chunksize))
    parsed = sum(outcomes)
    print(json.dumps({"files": len(paths), "parsed": parsed, "failed": len(paths) - parsed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

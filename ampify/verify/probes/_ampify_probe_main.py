"""Entry point of a verified run: `python _ampify_probe_main.py SCRIPT ARGS...`.

Installs the probes, then runs SCRIPT exactly as `python SCRIPT ARGS...` would: same working
directory, `sys.argv == [SCRIPT, *ARGS]`, the script's own directory as `sys.path[0]`, and a
fresh `__main__` module. The probe directory is taken off `sys.path` before the script starts,
so a training repository's own `utils.py` or `probe.py` imports as usual.
"""
import os
import signal
import sys
import types

import _ampify_probe_common as common
import _ampify_probe_gluon
import _ampify_probe_keras
import _ampify_probe_tf1
import _ampify_probe_torch


def _remove_probe_directory():
    probe_directory = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != probe_directory]


def _on_terminate(signum, frame):
    """The parent's timeout: keep whatever evidence was gathered, then go."""
    common.evidence["exit"] = {"kind": "terminated", "signal": signum}
    common.stop_script("terminated by the verifier (timeout)")


def _run_as_main(script_path):
    from importlib.machinery import SourceFileLoader

    # Since Python 3.9 `python SCRIPT` gives __main__ an absolute __file__ (not symlink-resolved).
    script_path = os.path.abspath(script_path)
    with open(script_path, "rb") as handle:
        source = handle.read()
    code = compile(source, script_path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = script_path
    main.__loader__ = SourceFileLoader("__main__", script_path)
    main.__builtins__ = __builtins__
    main.__cached__ = None
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def main():
    common.evidence["detected_backend"] = common.configure_from_environment()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    _remove_probe_directory()
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    signal.signal(signal.SIGTERM, _on_terminate)
    sys.meta_path.insert(0, common.hooks)
    _ampify_probe_torch.install()
    _ampify_probe_tf1.install()
    _ampify_probe_keras.install()
    _ampify_probe_gluon.install()
    try:
        _run_as_main(script)
    except SystemExit as exit_request:
        code = exit_request.code
        common.evidence["exit"] = {"kind": "sys.exit", "code": code if isinstance(code, int) else 1}
        common.write_evidence()
        raise
    except BaseException as error:
        common.evidence["exit"] = {"kind": "exception", "error": "%s: %s" % (type(error).__name__, error)}
        common.write_evidence()
        raise
    common.evidence["exit"] = {"kind": "finished"}
    common.write_evidence()


if __name__ == "__main__":
    main()

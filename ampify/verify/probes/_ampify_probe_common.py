"""Evidence store, early stop and post-import hooks shared by the ampify verify probes.

Stdlib only: this file runs inside the user's training interpreter, which may not have
ampify installed. The parent process tells it where to write through environment variables.
"""
import importlib.abc
import json
import os
import sys
import threading

EVIDENCE_PATH_ENV = "_AMPIFY_PROBE_EVIDENCE"
FULL_RUN_ENV = "_AMPIFY_PROBE_FULL"
FRAMEWORK_ENV = "_AMPIFY_PROBE_FRAMEWORK"
#: `ampify bench`: "WARMUP,STEPS": time optimizer steps, stop after WARMUP + STEPS of them
BENCH_ENV = "_AMPIFY_PROBE_BENCH"

evidence = {"probe": "ampify", "events": []}
_settings = {"path": None, "full": False, "pid": os.getpid(), "bench": None}
_write_lock = threading.RLock()  # re-entrant: the SIGTERM handler may interrupt a write


def configure_from_environment():
    """Read (and remove, so the script's own subprocesses never see them) the probe settings."""
    _settings["path"] = os.environ.pop(EVIDENCE_PATH_ENV, None)
    _settings["full"] = os.environ.pop(FULL_RUN_ENV, "0") == "1"
    bench = os.environ.pop(BENCH_ENV, "")
    if bench:
        warmup, steps = (int(part) for part in bench.split(","))
        _settings["bench"] = (warmup, steps)
    return os.environ.pop(FRAMEWORK_ENV, "")


def bench_steps():
    """(warm-up steps, measured steps) in an `ampify bench` run, else None."""
    return _settings["bench"]


def full_run():
    """True when the user asked to let the script run to its end (`--full`)."""
    return _settings["full"]


def section(name):
    """The evidence dictionary of one framework probe, created on first use."""
    return evidence.setdefault(name, {})


def in_verified_process():
    """False in processes the script forked (data loader workers, Hogwild trainers): they report nothing."""
    return os.getpid() == _settings["pid"]


def write_evidence():
    """Write the evidence atomically, so the parent never reads half a file."""
    path = _settings["path"]
    if not path or not in_verified_process():
        return
    with _write_lock:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(evidence, handle, default=str)
        os.replace(tmp, path)


def stop_script(reason):
    """End the script now: the evidence is in. os._exit so no `except SystemExit` can defeat it."""
    evidence["stopped_early"] = True
    evidence["stop_reason"] = reason
    evidence["exit"] = {"kind": "stopped"}
    try:
        write_evidence()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a script may have replaced or closed its streams
                pass
        os._exit(0)


def stop_when_allowed(reason):
    """Save the evidence so far; stop the script unless `--full` was asked for (or in a fork)."""
    write_evidence()  # a script that ends with os._exit must not lose what was seen
    if not full_run() and in_verified_process():
        stop_script(reason)


class _HookedLoader(importlib.abc.Loader):
    """Wraps a module's real loader and calls back once the module has fully executed."""

    def __init__(self, loader, callback, before=None):
        self._loader = loader
        self._callback = callback
        self._before = before

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        restore = self._before() if self._before else None
        try:
            self._loader.exec_module(module)
        finally:
            if restore:
                restore()
        # hand the module its real loader back: nothing after import should see this wrapper
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        try:
            self._callback(module)
        except Exception as error:  # a probe bug must never break the user's script
            evidence["events"].append("probe error on import of %s: %r" % (module.__name__, error))

    def __getattr__(self, name):
        return getattr(self._loader, name)


class PostImportHooks(importlib.abc.MetaPathFinder):
    """Runs a callback right after a watched module is imported, without importing it ourselves."""

    def __init__(self):
        self._callbacks = {}
        self._before = {}
        self._busy = set()

    def watch(self, module_name, callback, before=None):
        """Call `callback(module)` after `module_name` is imported (now, if it already is).

        `before()`, if given, runs just before the module executes and may return a function
        that undoes what it did, called once the module has executed.
        """
        if module_name in sys.modules:
            callback(sys.modules[module_name])
            return
        self._callbacks.setdefault(module_name, []).append(callback)
        if before is not None:
            self._before[module_name] = before

    def find_spec(self, fullname, path, target=None):
        callbacks = self._callbacks.get(fullname)
        if not callbacks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return spec
        del self._callbacks[fullname]

        def run_callbacks(module):
            for callback in callbacks:
                callback(module)

        spec.loader = _HookedLoader(spec.loader, run_callbacks, self._before.pop(fullname, None))
        return spec


hooks = PostImportHooks()


def patch_method(cls, name, make):
    """Replace `cls.name` by `make(original)`, once (a second install finds the marked wrapper)."""
    original = getattr(cls, name, None)
    if original is None or getattr(original, "_ampify_probe", False):
        return
    wrapper = make(original)
    wrapper._ampify_probe = True
    setattr(cls, name, wrapper)


def record_peak_host_memory(evidence):
    """`ampify bench`: this process's peak resident memory, where the platform reports it."""
    try:
        import resource

        evidence["peak_host_rss_kb"] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    except Exception:
        pass


def record_tensorflow_device_memory(evidence):
    """`ampify bench` under TensorFlow: the first GPU's peak memory, as TensorFlow's allocator
    reports it (`tf.config.experimental.get_memory_info`); nothing on a machine without a GPU."""
    try:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        evidence["cuda"] = bool(gpus)
        if gpus:
            evidence["peak_device_memory"] = int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
    except Exception:
        pass

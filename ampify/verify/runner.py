"""Run a script under the probes in a subprocess and judge whether mixed precision engaged."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

from ampify.verify import detect
from ampify.verify.judge import RunFacts
from ampify.verify.targets import VERIFY_TARGETS, judge
from ampify.verify.result import CANNOT_VERIFY, SCRIPT_FAILED, VerifyResult

PROBE_DIRECTORY = Path(__file__).resolve().parent / "probes"
PROBE_MAIN = PROBE_DIRECTORY / "_ampify_probe_main.py"
TERMINATE_GRACE_SECONDS = 3.0
CUDA_CHECK_TIMEOUT_SECONDS = 120.0

# Must match the names in probes/_ampify_probe_common.py (which cannot import ampify).
EVIDENCE_PATH_ENV = "_AMPIFY_PROBE_EVIDENCE"
FULL_RUN_ENV = "_AMPIFY_PROBE_FULL"
FRAMEWORK_ENV = "_AMPIFY_PROBE_FRAMEWORK"

_CUDA_CHECK = "import torch, sys; sys.stdout.write('cuda=%s' % torch.cuda.is_available())"


def _no_gpu_device_files() -> bool:
    """On Linux a CUDA (or ROCm) GPU shows up as device files; none at all means no GPU, cheaply."""
    if not sys.platform.startswith("linux"):
        return False
    dev = Path("/dev")
    return not any(dev.glob("nvidia*")) and not (dev / "dxg").exists() and not (dev / "kfd").exists()


def cuda_available(python: str) -> Optional[bool]:
    """Ask the target interpreter (never this one, which may lack torch) whether it sees a CUDA GPU.

    Returns None when torch cannot even be imported there.
    """
    if _no_gpu_device_files():
        return False
    try:
        completed = subprocess.run(
            [python, "-c", _CUDA_CHECK], capture_output=True, text=True, timeout=CUDA_CHECK_TIMEOUT_SECONDS,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if "cuda=True" in completed.stdout:
        return True
    if "cuda=False" in completed.stdout:
        return False
    return None


def _kill_group(process: subprocess.Popen, sig: int) -> None:
    """Signal the script's whole process group (it runs in its own session)."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(process.pid, sig)
        elif process.poll() is None:  # Windows: no process groups to signal
            process.kill()
    except (ProcessLookupError, PermissionError):
        pass


_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> bool:
    """Linux: orphans of the script (a daemon that called setsid() and whose parent exited) are
    re-parented to this process instead of init, so `_descendants` still finds them."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _descendants(root: int) -> set:
    """Every live process below `root`, read from /proc (empty where there is no /proc)."""
    children = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ")"
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, pending = set(), [root]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def _end_stragglers(before: set) -> None:
    """Kill what the script left running outside its process group (setsid daemons), then reap
    the ones that came to this process as orphans."""
    for _ in range(3):
        stragglers = _descendants(os.getpid()) - before
        if not stragglers:
            return
        for pid in stragglers:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in stragglers:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass  # not our child: its own parent reaps it
        time.sleep(0.05)


def _run_child(command, env, timeout, output_path):
    """Run the probed script in its own process group; return (returncode, timed_out).
    Everything it started is ended afterwards, also processes that left its group."""
    _become_subreaper()
    before = _descendants(os.getpid())
    try:
        return _run_and_wait(command, env, timeout, output_path)
    finally:
        _end_stragglers(before)


def _run_and_wait(command, env, timeout, output_path):
    with open(output_path, "wb") as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )
        timed_out = False
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process, signal.SIGTERM)  # the probe saves its evidence on SIGTERM
            try:
                returncode = process.wait(timeout=TERMINATE_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                _kill_group(process, signal.SIGKILL)
                returncode = process.wait()
        # Whatever the script started (data loader workers, servers) goes with it.
        _kill_group(process, signal.SIGKILL)
    return returncode, timed_out


def _read_probe_evidence(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _cannot_verify(script: str, backend: str, reason: str, started: float) -> VerifyResult:
    target = VERIFY_TARGETS[backend]
    return VerifyResult(
        script=script, status=CANNOT_VERIFY, framework=target.framework, backend=target.backend,
        verdict="cannot verify here: %s" % reason, reason=reason, elapsed=time.monotonic() - started,
    )


def _not_started(script: str, reason: str, started: float) -> VerifyResult:
    return VerifyResult(script=script, status=SCRIPT_FAILED, framework="unknown", backend="unknown",
                        verdict="script failed: %s" % reason, reason=reason, elapsed=time.monotonic() - started)


def verify_script(
    script: Path,
    script_args: Sequence[str] = (),
    python: Optional[str] = None,
    full: bool = False,
    timeout: Optional[float] = None,
) -> VerifyResult:
    """Run `python SCRIPT ARGS` under the probes and report whether mixed precision really ran.

    The script is never edited: probe modules are started before it and write their evidence to
    a file this process reads. By default the script is stopped after its first training step
    once evidence is in; `full` lets it finish; `timeout` bounds it (whole process group killed).
    """
    started = time.monotonic()
    as_given = os.fspath(script)  # sys.argv[0] is exactly what the user typed ("./train.py" stays so)
    script = Path(as_given)
    if python is not None and not python.strip():
        return _not_started(as_given, "--python is empty: name the interpreter of the training environment", started)
    python = python or sys.executable
    if not script.is_file():
        reason = ("not a script file (a directory or zip app cannot be verified): %s" % as_given
                  if script.exists() else "no such script: %s" % as_given)
        return _not_started(as_given, reason, started)
    backend = detect.detect_backend(detect.read_script_text(script))
    if VERIFY_TARGETS[backend].needs_cuda:
        cuda = cuda_available(python)
        if not cuda:
            reason = "apex amp needs a CUDA GPU"
            if cuda is None:
                reason += " (torch could not be imported by %s)" % python
            return _cannot_verify(as_given, backend, reason, started)

    command = [python, str(PROBE_MAIN), as_given, *script_args]
    env = dict(os.environ)
    env[FULL_RUN_ENV] = "1" if full else "0"
    env[FRAMEWORK_ENV] = backend
    env["PYTHONUNBUFFERED"] = "1"  # keep the script's prints and the framework logs in order
    notes = []
    for name, value, note in VERIFY_TARGETS[backend].environment:
        if name not in env:
            env[name] = value
            notes.append(note)
    with tempfile.TemporaryDirectory(prefix="ampify-verify-") as work:
        evidence_path = Path(work) / "evidence.json"
        output_path = Path(work) / "output.log"
        env[EVIDENCE_PATH_ENV] = str(evidence_path)
        try:
            returncode, timed_out = _run_child(command, env, timeout, output_path)
        except OSError as error:  # --python names nothing runnable
            return _not_started(as_given, "cannot run %s: %s" % (python, error.strerror or error), started)
        output = output_path.read_bytes().decode("utf-8", errors="replace")
        probe = _read_probe_evidence(evidence_path)

    facts = RunFacts(output=output, probe=probe, returncode=returncode, timed_out=timed_out, timeout=timeout)
    backend, judgement = judge(backend, facts)
    target = VERIFY_TARGETS[backend]
    elapsed = time.monotonic() - started
    return VerifyResult(
        script=as_given, status=judgement.status, framework=target.framework, backend=target.backend,
        verdict="%s, %.1f s" % (judgement.verdict, elapsed), reason=judgement.reason,
        evidence=judgement.evidence, elapsed=elapsed, output=output, returncode=returncode,
        stopped_early=facts.stopped_early, timed_out=timed_out, command=command, notes=notes,
    )

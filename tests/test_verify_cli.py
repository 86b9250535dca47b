"""`ampify verify` as a command: several scripts, JSON, --timeout, --python, and `python SCRIPT` semantics."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from verify_helpers import FIXTURES, process_is_gone

from ampify.verify.cli import main


def _startup_record(output: str) -> dict:
    line = next(line for line in output.splitlines() if line.startswith("STARTUP "))
    return json.loads(line[len("STARTUP "):])


def test_several_scripts_print_a_table_and_the_combined_exit_code(capsys):
    code = main([str(FIXTURES / "torch_fp32.py"), str(FIXTURES / "apex_amp.py"), "--python", sys.executable])
    printed = capsys.readouterr().out.splitlines()
    assert code == 1  # "not active" outranks "cannot verify"
    assert printed[0].split() == ["SCRIPT", "STATUS", "VERDICT"]
    assert any(line.startswith(str(FIXTURES / "torch_fp32.py")) and "not active: 0/" in line for line in printed)
    assert any("cannot verify here: apex amp needs a CUDA GPU" in line for line in printed)
    assert printed[-1] == "1 not active, 1 cannot verify"


def test_missing_script_and_usage_errors_return_codes_instead_of_exiting(capsys):
    assert main([str(FIXTURES / "no_such_script.py")]) == 2
    assert "script failed: no such script" in capsys.readouterr().out
    assert main([str(FIXTURES / "torch_fp32.py"), "--python", str(FIXTURES / "no_such_python")]) == 2
    assert "script failed: cannot run" in capsys.readouterr().out
    assert main([]) == 2  # usage error: no script given


def test_python_m_json_keeps_cwd_argv_and_sys_path_semantics():
    """Run from fixtures/verify with a relative path: the script sees exactly `python repo/train.py ARGS`."""
    completed = subprocess.run(
        [sys.executable, "-m", "ampify.verify", "./repo/train.py", "--json", "--show-output", "--", "--epochs", "1"],
        cwd=FIXTURES, capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    payload = json.loads(completed.stdout)
    assert payload["exit_code"] == 0
    [result] = payload["results"]
    assert result["status"] == "verified" and result["exit_code"] == 0 and result["framework"] == "torch"
    assert result["evidence"]["reduced_precision_ops"] > 0 and result["evidence"]["optimizer_steps"] == 1
    startup = _startup_record(result["output"])
    assert startup["argv"] == ["./repo/train.py", "--epochs", "1"] and result["script"] == "./repo/train.py"
    assert startup["cwd"] == str(FIXTURES)
    assert startup["path0"] == str(FIXTURES / "repo")
    assert startup["name"] == "__main__" and startup["file"] == str(FIXTURES / "repo" / "train.py")
    assert startup["local_modules"] == ["repo/transforms.py", "repo/utils.py", "repo/probe.py"]


def test_timeout_kills_the_whole_process_group(tmp_path, capsys):
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    code = main([str(FIXTURES / "sleeps.py"), "--timeout", "2", "--", str(pid_file)])
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == 2 and "script failed: timed out after 2 s before any evidence" in out
    assert elapsed < 15  # 2 s timeout + 3 s grace at most, plus startup
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not process_is_gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process_is_gone(grandchild)


def _interpreter_without_ampify(tmp_path: Path) -> str:
    """A fresh venv that sees torch (and its dependencies) but not ampify."""
    venv = tmp_path / "train-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site_packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    torch_site = Path(torch.__file__).resolve().parent.parent
    numpy_site = Path(pytest.importorskip("numpy").__file__).resolve().parent.parent
    Path(site_packages, "training_deps.pth").write_text("%s\n%s\n" % (torch_site, numpy_site))
    probe = subprocess.run([str(python), "-c", "import ampify"], capture_output=True, cwd=tmp_path)
    if probe.returncode == 0:
        pytest.skip("ampify is installed next to torch here; cannot build an interpreter without it")
    return str(python)


def test_python_option_runs_an_interpreter_without_ampify(tmp_path):
    python = _interpreter_without_ampify(tmp_path)
    env = dict(os.environ, PYTHONPATH="")  # nothing from this checkout leaks in
    completed = subprocess.run(
        [sys.executable, "-m", "ampify.verify", str(FIXTURES / "repo" / "train.py"), "--python", python,
         "--json", "--show-output"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    [result] = json.loads(completed.stdout)["results"]
    assert result["status"] == "verified" and result["command"][0] == python
    startup = _startup_record(result["output"])
    assert startup["ampify_importable"] is False
    assert startup["local_modules"] == ["repo/transforms.py", "repo/utils.py", "repo/probe.py"]
    assert startup["cwd"] == str(tmp_path)


def test_timeout_also_ends_a_grandchild_that_left_the_process_group(tmp_path, capsys):
    """A daemon-style grandchild: setsid() puts it outside the script's group, and its parent
    exits, so it is orphaned; verify must still find it and end it."""
    script = tmp_path / "daemonizes.py"
    pid_file = tmp_path / "daemon.pid"
    script.write_text(
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "        time.sleep(120)\n"
        "    os._exit(0)\n"
        "time.sleep(120)\n"
    )
    code = main([str(script), "--timeout", "2"])
    assert code == 2, capsys.readouterr().out
    daemon = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not process_is_gone(daemon) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process_is_gone(daemon), "a setsid() grandchild outlived ampify verify"


def test_an_empty_python_is_a_usage_error_not_the_default_interpreter(capsys):
    assert main([str(FIXTURES / "torch_fp32.py"), "--python", ""]) == 2
    assert "--python is empty" in capsys.readouterr().err


def test_keras_scripts_are_not_run_with_legacy_keras(tmp_path):
    """TF_USE_LEGACY_KERAS=1 is for TF1 graph code only: it would swap a Keras 3 script's Keras."""
    from ampify.verify.runner import verify_script

    body = (
        "import os\n"
        "if False:\n"
        "    import tensorflow as tf\n"
        "    {code}\n"
        "print('LEGACY=%s' % os.environ.get('TF_USE_LEGACY_KERAS'))\n"
    )
    keras_script = tmp_path / "keras_fit.py"
    keras_script.write_text(body.format(code="model = tf.keras.Sequential([]); model.fit(x, y)"))
    tf1_script = tmp_path / "tf1_graph.py"
    tf1_script.write_text(body.format(code="x = tf.placeholder(tf.float32); sess = tf.Session()"))
    keras_run = verify_script(keras_script)
    assert "LEGACY=None" in keras_run.output and keras_run.notes == []
    tf1_run = verify_script(tf1_script)
    assert "LEGACY=1" in tf1_run.output and tf1_run.notes

"""The test zygote (``millm_host.testing.zygote``): a forked launch behaves as an exec'd one would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from millm_host.testing import zygote

CHILD = """
import json, os, sys, time
print(json.dumps({
    "argv": sys.argv[1:],
    "path0": sys.path[0],
    "probe": os.environ.get("MILLM_ZYGOTE_PROBE"),
    "own_session": os.getsid(0) == os.getpid(),
    "torch_imported": "torch" in sys.modules,
    "millm_imported": any(name.split(".")[0].startswith("millm") for name in sys.modules if name != __name__),
}))
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def launch(tmp_path):
    (tmp_path / "zygote_child.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "MILLM_ZYGOTE_PROBE": "from the launch"}
    started = []

    def start(*args: str, **extra: str):
        log = open(tmp_path / f"child-{len(started)}.log", "wb")
        proc = zygote.popen([sys.executable, "-m", "zygote_child", *args], {**env, **extra}, log)
        started.append((proc, log))
        return proc, log

    yield start
    for proc, log in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


def output(log) -> dict:
    return json.loads(open(log.name).read().splitlines()[0])


def test_a_forked_launch_runs_its_module_with_its_own_environment_session_and_exit_code(launch):
    proc, log = launch("3")
    assert isinstance(proc, zygote.ForkedProcess)
    assert proc.wait(60) == 3
    seen = output(log)
    assert seen["argv"] == ["3"] and seen["probe"] == "from the launch"
    assert seen["path0"] == os.getcwd() and seen["own_session"]
    assert seen["torch_imported"], "the zygote pre-imports torch"
    assert not seen["millm_imported"], "nothing of millm is imported before the fork"


def test_a_signal_ends_a_forked_launch_as_popen_reports_it(launch):
    proc, log = launch("sleep")
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.2)
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGTERM)  # its own session, as start_new_session gives
    assert proc.wait(60) == -signal.SIGTERM
    proc.kill()  # gone already: nothing happens, as with Popen


def test_a_variable_read_at_import_time_gets_a_new_interpreter(launch):
    proc, log = launch("0", HF_HUB_OFFLINE="0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1")
    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(60) == 0
    assert not output(log)["torch_imported"]


def test_a_launch_forks_only_when_nothing_read_before_the_fork_differs():
    base = {"HOME": "/root", "SOME_TOOL_DIR": "/a"}
    read = frozenset({"SOME_TOOL_DIR", "HOME"})
    launch = {**base, "MILLM_PORT": "1", "PROBE_X": "2", "PYTHONPATH": "/x", "LANGCHAIN_TRACING_V2": "false"}
    assert not zygote.blocking(launch, base, read)
    assert zygote.blocking({**base, "SOME_TOOL_DIR": "/b"}, base, read) == {"SOME_TOOL_DIR"}  # its import read it
    assert zygote.blocking({"HOME": "/root"}, base, read) == {"SOME_TOOL_DIR"}
    assert zygote.blocking({**base, "OMP_NUM_THREADS": "1"}, base, read) == {"OMP_NUM_THREADS"}  # read natively
    assert zygote.blocking({**base, "PYTHONHASHSEED": "1"}, base, read) == {"PYTHONHASHSEED"}  # read at start


def test_a_variable_a_library_set_since_gets_a_zygote_of_its_own(launch, monkeypatch):
    """Imported mid-session, a library may set a variable (``KMP_DUPLICATE_LIB_OK``) that every later
    launch inherits: those fork from a zygote started in the environment as it is now."""
    before, _ = launch("0")
    session = list(zygote._zygotes)
    monkeypatch.setattr(zygote, "_zygotes", list(session))  # the session's own list stays as it is
    try:
        monkeypatch.setenv("KMP_DUPLICATE_LIB_OK", "TRUE")
        after, _ = launch("0", KMP_DUPLICATE_LIB_OK="TRUE")  # as a server's environment inherits it
        assert isinstance(before, zygote.ForkedProcess) and isinstance(after, zygote.ForkedProcess)
        started = [z for z in zygote._zygotes if z not in session]
        assert len(started) == 1 and started[0].env["KMP_DUPLICATE_LIB_OK"] == "TRUE"
        assert after.wait(60) == 0 and before.wait(60) == 0

        # A zygote that goes away leaves its children running, their status unknown: wait still ends.
        orphan, _ = launch("sleep", KMP_DUPLICATE_LIB_OK="TRUE")
        assert isinstance(orphan, zygote.ForkedProcess)
        started[0].proc.kill()
        started[0].proc.wait(10)
        assert orphan.poll() is None
        os.kill(orphan.pid, signal.SIGKILL)
        assert orphan.wait(30) == -signal.SIGKILL
    finally:
        for made in [z for z in zygote._zygotes if z not in session]:
            made.stop()

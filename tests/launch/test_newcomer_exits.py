"""The exit codes and next steps a newcomer meets first: ``orch stop`` where nothing ever ran,
``--gpus 8`` read as a count, a busy GPU's refusal (through the sandbox: ssh, pct, NVML)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import cli_in_process

SESSION = "newcomer"


@pytest.fixture(scope="module")
def config(sandbox_config) -> Path:  # type: ignore[no-untyped-def]
    """Our own session and a workdir no other test has run in."""
    return sandbox_config(SESSION, workdir=lambda ct: ct["workdir"] + "-newcomer")


@pytest.fixture
def orch(config: Path, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    return cli_in_process(config, capsys)


@pytest.mark.e2e
def test_stop_where_nothing_ever_ran_is_exit_0_with_the_next_step(orch) -> None:  # type: ignore[no-untyped-def]
    code, out, err = orch("stop", "ct202", "--grace", "5")
    assert code == 0, out + err
    assert "ct202 has no run yet; nothing to stop (start one: orch launch ct202)" in out


@pytest.mark.e2e
def test_gpus_8_on_an_8_gpu_container_is_a_bad_argument(orch, sandbox_scenario) -> None:  # type: ignore[no-untyped-def]
    sandbox_scenario("idle")
    code, out, err = orch("launch", "ct202", "--cmd", "echo hi", "--gpus", "8")
    assert code == 2, out + err
    assert "ct202 has no GPU 8 (it sees GPUs 0-7)" in err
    assert "--gpus 0-7 uses all 8" in err


@pytest.mark.e2e
def test_a_busy_gpu_refusal_names_the_commands_that_free_it(orch, sandbox_scenario) -> None:  # type: ignore[no-untyped-def]
    sandbox_scenario("healthy")
    code, out, err = orch("launch", "ct202", "--cmd", "echo hi", "--gpus", "0")
    assert code == 4, out + err
    assert "GPU 0 busy" in err
    # the holder is one of the scenario's fake PIDs: only switching the scenario frees it
    assert "a fake process of the sandbox's scenario holds it" in err
    assert re.search(r"free it with orch sandbox scenario idle( --dir \S+)? \(or pick", err), err


@pytest.mark.e2e
def test_ctrl_c_after_the_start_step_says_what_is_left_and_how_to_undo_it(  # type: ignore[no-untyped-def]
    orch, config, sandbox_scenario
) -> None:
    """SIGINT while launch verifies the run: exit 130, and the line names the run, the
    container and ``orch stop``; the run is indeed still there to stop."""
    sandbox_scenario("idle")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "-c",
            str(config),
            "launch",
            "ct202",
            "--cmd",
            "python3 -c 'import time\nwhile True: print(1, flush=True); time.sleep(0.2)'",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        # the start step's line comes when it is done; verify then lasts at least
        # VERIFY_MIN_ALIVE_S (5 s, lifecycle/launch.py) by design, so SIGINT lands in it
        for line in proc.stdout:
            seen.append(line)
            if "in tmux session 'newcomer'" in line:
                break
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()
        assert proc.wait(timeout=60) == 130, "".join(seen) + rest
    finally:
        proc.kill()
        proc.wait()
    said = re.search(r"run (\S+) started in ct202 and is still running: orch stop ct202", rest)
    assert said, "".join(seen) + rest
    code, out, err = orch("stop", "ct202", "--grace", "5")
    assert code == 0 and f"stopped run {said.group(1)}" in out, out + err

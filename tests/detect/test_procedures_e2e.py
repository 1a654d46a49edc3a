"""``orch playbook run`` end to end through the sandbox (real sshd, pct stand-in, tmux, agent).

Own tmux session (``proc-e2e``), two GPUs per container (6, 7) so the per-GPU warm-up runs
twice, and a compile-cache directory inside each container's workdir (never the machine's
real ``/tmp/torchinductor_root``). The sandbox has no CUDA: torch here is a CPU-only build,
so the warm-up step must say it skipped and succeed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import run
from orchestrator.config.inventory import load_inventory
from tests.helpers import stand_in_env, wait_for

pytestmark = pytest.mark.e2e

SESSION = "proc-e2e"
TICKER = (
    'python3 -c "import time\nfor i in range(900):\n'
    "    print('tick', i, flush=True); time.sleep(0.1)\""
)


@pytest.fixture(scope="module")
def config(sandbox_config) -> Path:  # type: ignore[no-untyped-def]
    """The sandbox's hosts.yaml with our session, two drafter GPUs, a private compile cache and
    the trainer's torch-free stand-in (tests.helpers.stand_in_env): the bundled run here only
    has to run until stopped, stop on SIGINT and print its warm-up line."""
    return sandbox_config(
        SESSION,
        gpus={"drafter": [6, 7]},
        trainer_config="tiny-cpu",
        env=lambda ct: {
            **stand_in_env(ct),
            "TORCHINDUCTOR_CACHE_DIR": f"{ct['workdir']}/inductor-cache",
        },
    )


@pytest.fixture
def orch(config: Path, capsys: pytest.CaptureFixture[str], sandbox_scenario):  # type: ignore[no-untyped-def]
    """``orch -c CONFIG ARGS`` in-process: (exit code, stdout, stderr); stops our runs after."""
    sandbox_scenario("idle")

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = run(["-c", str(config), *args])
        out, err = capsys.readouterr()
        return code, out, err

    yield call
    for ct in ("ct200", "ct201", "ct202"):
        call("stop", ct, "--grace", "5")


def _manifest(workdir: Path, run_id: str) -> dict:
    return json.loads((workdir / "runs" / run_id / "manifest.json").read_text())


def test_prewarm_relaunch_of_a_dead_custom_command_run(orch, sandbox) -> None:  # type: ignore[no-untyped-def]
    workdir = sandbox.workdir("ct201")
    code, out, err = orch("launch", "ct201", "--cmd", TICKER, "--name", "first", "--json")
    assert code == 0, err
    first = json.loads(out)["run_id"]
    assert orch("stop", "ct201", "--grace", "10")[0] == 0  # the run is dead before we start

    code, out, err = orch("playbook", "run", "prewarm-relaunch", "ct201", "--yes", "--json")
    assert code == 0, err
    doc = json.loads(out)
    steps = doc["steps"]
    assert [s["status"] for s in steps] == ["done"] * 6
    assert steps[0]["output"] == "nothing was running"
    assert steps[1]["output"].startswith("free after ") and "(GPUs 6,7)" in steps[1]["output"]
    for s, gpu in zip(steps[2:4], ("6", "7"), strict=True):
        assert s["name"].endswith(f"(GPU {gpu})")
        assert s["output"].startswith(f"GPU {gpu}: warm-up skipped: torch ")
        assert "CPU-only build" in s["output"]
    new = steps[4]["output"].split()[1]
    assert new.endswith("-relaunch") and new != first
    assert steps[5]["output"].startswith(f"run {new} is running")

    relaunched = _manifest(workdir, new)
    assert relaunched["command"] == TICKER, "a custom --cmd run is relaunched with its command"
    assert relaunched["gpus"] == [6, 7]
    # resume: auto for a custom command: the same command line, told where the last run was
    assert relaunched["env"]["ORCH_RESUME"] == "auto"
    assert (
        relaunched["env"]["ORCH_RESUME_FROM"]
        == f"{sandbox.container_workdir('ct201')}/runs/{first}"
    )
    assert (workdir / "runs" / first / "exit_status").is_file(), "old run kept"
    assert (workdir / "runs" / "current").read_text().strip() == new


def test_prewarm_relaunch_of_a_running_bundled_trainer(orch, sandbox) -> None:  # type: ignore[no-untyped-def]
    workdir = sandbox.workdir("ct200")
    # --forever: still running when the procedure stops it, however fast the machine trains
    code, out, err = orch("launch", "ct200", "--name", "bundled", "--json", "--", "--forever")
    assert code == 0, err
    old = json.loads(out)
    assert (workdir / "runs" / old["run_id"] / "train.log").read_text()

    code, out, err = orch("playbook", "run", "prewarm-relaunch", "ct200", "--yes")
    assert code == 0, err
    lines = out.splitlines()
    assert (
        lines[0]
        == "[1/6] stop the current run (its log and exit status are kept): [orch action] stop"
    )
    # relaunched as it was launched: the bundled trainer with its extra arguments
    assert f"  previous run {old['run_id']}: bundled trainer --config tiny-cpu --forever" in lines
    assert any(line.startswith("  stopped (signals SIGINT") for line in lines), out
    assert sum(line.startswith("  GPU ") and "warm-up skipped" in line for line in lines) == 2
    assert lines[-1] == "prewarm-relaunch on ct200: all 6 steps done"

    # the old run stopped gracefully: the trainer's SIGINT exit status, log kept
    assert (workdir / "runs" / old["run_id"] / "exit_status").read_text().strip() == "130"
    new = (workdir / "runs" / "current").read_text().strip()
    assert new != old["run_id"] and new.endswith("-relaunch")
    manifest = _manifest(workdir, new)
    assert " -m trainer " in manifest["command"]
    # its old arguments, the warm-up forced on, resuming from the old run's checkpoints
    assert manifest["command"].endswith(f"runs/{new} --forever --warmup sequential --resume auto")
    log = workdir / "runs" / new / "train.log"
    # the bundled trainer's own sequential warm-up runs before its threads start
    wait_for(lambda: "trainer: warm-up" in log.read_text(), 60, what="the trainer's warm-up line")


def test_clean_env_dry_run_lists_every_step_and_refuses_to_overwrite(orch, sandbox) -> None:  # type: ignore[no-untyped-def]
    workdir, inside = sandbox.workdir("ct202"), sandbox.container_workdir("ct202")
    code, out, _ = orch("playbook", "run", "clean-env", "ct202")
    assert code == 0
    venv = f"{inside}/.venv-orch"
    python = load_inventory(sandbox.config_path).container("ct202").python
    for expected in (
        "1. stop the current run",
        f"{python} -m venv {venv}",
        f"{venv}/bin/python -m pip install -r {inside}/requirements.txt",
        f"git -C {inside} stash push --include-untracked",
        f"[orch action] archive {inside}/inductor-cache",
        "warm up one device at a time (GPU 6)",
        "warm up one device at a time (GPU 7)",
        "8. relaunch the run",
        "9. verify it came up",
        f"overwrites {venv}: --yes refuses if it exists",
    ):
        assert expected in out, expected

    code, out, err = orch("launch", "ct202", "--cmd", TICKER, "--name", "live", "--json")
    assert code == 0, err
    live = json.loads(out)["run_id"]
    (workdir / ".venv-orch").mkdir(exist_ok=True)
    (workdir / ".venv-orch" / "marker").write_text("mine")

    code, out, err = orch("playbook", "run", "clean-env", "ct202", "--yes")
    assert code == 4, (out, err)
    assert f"would overwrite {venv}, which exists" in err and "--force" in err
    assert "nothing was done" in err
    assert (workdir / ".venv-orch" / "marker").read_text() == "mine"
    code, out, _ = orch("status", "ct202", "--json")
    row = json.loads(out)
    row = row[0] if isinstance(row, list) else row
    assert (row["run_id"], row["run_state"]) == (live, "running"), "the live run was not touched"


def test_force_archives_instead_of_deleting(orch, sandbox, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A small procedure through the same machinery: archive action and overwrites + --force."""
    workdir = sandbox.workdir("ct202")
    (tmp_path / "fresh.yaml").write_text(
        "id: fresh\ntitle: Fresh venv\nkind: procedure\ndiagnosis: test\nsteps:\n"
        "  - {name: archive the cache, action: archive, path: '{cache_dir}'}\n"
        "  - name: new venv\n    run: '{python} -m venv --without-pip {venv}'\n"
        "    overwrites: '{venv}'\n"
    )
    cache = workdir / "inductor-cache"
    cache.mkdir(exist_ok=True)
    (cache / "entry").write_text("compiled")
    (workdir / ".venv-orch").mkdir(exist_ok=True)
    (workdir / ".venv-orch" / "marker").write_text("mine")
    before = set(workdir.iterdir())

    args = ("playbook", "run", "fresh", "ct202", "--playbooks", str(tmp_path), "--yes")
    code, _, err = orch(*args)
    assert code == 4 and "would overwrite" in err
    code, out, err = orch(*args, "--force", "--json")
    assert code == 0, err
    steps = json.loads(out)["steps"]
    inside = sandbox.container_workdir("ct202")
    assert steps[0]["output"].startswith(
        f"archived {inside}/inductor-cache -> {inside}/inductor-cache.orch-"
    )
    assert steps[1]["output"].startswith(f"archived {inside}/.venv-orch -> ")

    added = set(workdir.iterdir()) - before
    archived = {p.name.split(".orch-")[0] for p in added}
    assert archived == {"inductor-cache", ".venv-orch"}, added
    for p in added:  # contents moved intact, nothing deleted
        assert p.joinpath("entry" if p.name.startswith("inductor") else "marker").is_file()
    assert (workdir / ".venv-orch" / "pyvenv.cfg").is_file() and not cache.exists()
    code, out, _ = orch(*args[:-1], "--yes", "--json")  # the new venv exists now
    assert code == 4, "refused again without --force"

"""Hostile and bad input: an agent answering garbage, a 100 MB line, binary logs, bad playbooks.

The hostile agent is the interpreter that runs it: the host's (hosts.yaml ``host_python:``)
for the host observer, the container's (``python:``) with ``observe: container``; a script
that passes deploy's checks through to python3 and answers agent commands with ``$MODE``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.reliability.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOSTILE = r"""#!/bin/sh
# agent runs are `python -S -c BOOT BUNDLE CMD...`; anything else (deploy) is real python3
[ "$1" = "-S" ] || exec python3 "$@"
mode=$(cat "$(dirname "$0")/mode" 2>/dev/null)
emit() {
  case "$mode" in
    garbage) printf 'Segmentation fault (core dumped)\n\001\377 {{{ not json\n' ;;
    truncated) printf '{"schema_version": 1, "target": "ct200", "taken_at": 1.0, "gpus": [{"index": 0' ;;
    future) printf '{"schema_version": 99, "target": "ct200", "taken_at": %s.0}\n' "$(date +%s)" ;;
    huge) head -c 104857600 /dev/zero | tr '\0' 'x'; echo ;;
    *) exec python3 "$@" ;;
  esac
}
case " $* " in
  *" stream "*|*" host-stream "*) while :; do emit "$@"; sleep 1; done ;;
  *) emit "$@" ;;
esac
"""

MODES = {
    "garbage": "the agent answers garbage (a crash message and bytes that are not JSON)",
    "truncated": "the agent answers a truncated JSON line",
    "future": "the agent answers schema_version 99 (from the future)",
    "huge": "the agent answers one 100 MB line",
}


@pytest.fixture(scope="module", params=["host", "container"])
def hostile(fleet, tmp_path_factory, request):
    """(config, mode file, path): the hostile script answers for ct200 observed from its host
    (the host's python) or from inside (ct200's python, in the container's own file system:
    an LXC container sees no host path)."""
    d = tmp_path_factory.mktemp("hostile")
    where, python = d, str(d / "python")  # process mode: the container's paths are the host's
    doc = yaml.safe_load(fleet.config.read_text())
    if request.param == "host":
        if fleet.info.isolation != "lxc":
            pytest.skip("process-mode containers are observed from inside")
        doc["hosts"]["sandbox"]["host_python"] = python
    else:
        if fleet.info.isolation == "lxc":
            where, python = fleet.info.host_path("ct200", "/root/hostile"), "/root/hostile/python"
        doc["hosts"]["sandbox"]["observe"] = "container"
        doc["containers"]["ct200"]["python"] = python
    where.mkdir(parents=True, exist_ok=True)
    script = where / "python"
    script.write_text(HOSTILE)
    script.chmod(0o755)
    path = d / "hostile.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    fleet.scenario("idle")
    return path, where / "mode", request.param


_MEASURE = textwrap.dedent(
    """
    import json, resource, sys, time
    from pathlib import Path
    from orchestrator.config.inventory import load_inventory
    from orchestrator.errors import OrchError
    from orchestrator.remote.hostlink import HostLink
    from orchestrator.remote.target import Target
    inv = load_inventory(Path(sys.argv[1]))
    if sys.argv[2] == "host":
        from orchestrator.remote import deploy
        t = HostLink(inv, "sandbox", ["ct200"])
        h = inv.hosts["sandbox"]
        deploy.ensure_agent(t.transport, h.agent_dir, h.host_python)  # deploy first
    else:
        t = Target(inv, "ct200")
        t.bundle_dir()  # deploy first: its cost is not the answer's
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    try:
        t.observe(timeout=60) if sys.argv[2] == "host" else t.snapshot(timeout=60)
        error = None
    except OrchError as exc:
        error = f"{type(exc).__name__}: {exc}"
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"error": error, "peak_growth_mib": (after - before) / 1024,
                      "took_s": time.monotonic() - started}))
    """
)


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            m,
            id=m,
            marks=[
                pytest.mark.fault(
                    area="hostile input",
                    fault=what,
                    must="`orch check`: a clear agent-protocol-error finding, no crash (no "
                    "traceback, exit 1-3)"
                    + (
                        "; orch's memory stays bounded (peak growth < 64 MiB)"
                        if m == "huge"
                        else ""
                    ),
                ),
            ],
        )
        for m, what in MODES.items()
    ],
)
def test_hostile_agent_answer(hostile, mode, observe, tmp_path):
    config, mode_file, path = hostile
    mode_file.write_text(mode)
    try:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "-c",
                str(config),
                "check",
                "ct200",
                "--json",
                "--db",
                str(tmp_path / "orch.db"),
                "--timeout",
                "60",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=ROOT,
        )
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
        doc = json.loads(res.stdout)
        t = doc["targets"][0]
        proto = [f for f in t["findings"] if f["kind"] == "agent-protocol-error"]
        observe(
            f"observed from the {path}: check exit {res.returncode}, state {t['state']!r}: "
            f"{proto[0]['summary'][:110] if proto else [f['kind'] for f in t['findings']]}"
        )
        assert res.returncode in (1, 2, 3) and proto, doc
        if mode == "huge":
            m = subprocess.run(
                [sys.executable, "-c", _MEASURE, str(config), path],
                capture_output=True,
                text=True,
                timeout=180,
                cwd=ROOT,
            )
            got = json.loads(m.stdout.strip().splitlines()[-1])
            observe(
                f"orch's peak RSS grew {got['peak_growth_mib']:.0f} MiB reading the answer "
                f"({got['took_s']:.1f} s): {str(got['error'])[:90]}"
            )
            assert got["peak_growth_mib"] < 64, got
    finally:
        mode_file.write_text("")


@pytest.mark.fault(
    area="hostile input",
    fault="binary bytes and a 100 MB line (no newline) written by the run to its log and pane",
    must="the agent keeps answering (reachable, no protocol error), no crash, "
    "and orch's memory stays bounded (peak growth < 64 MiB)",
)
def test_binary_log_and_huge_pane_line(fleet, observe, tmp_path):
    fleet.scenario("idle")
    fleet.agent_launch(
        "ct200",
        cmd="sleep 2; head -c 65536 /dev/urandom; head -c 104857600 /dev/zero | tr '\\0' 'y'; "
        "echo; echo step=1 loss=2.0; sleep 600",
    )
    from tests.helpers import wait_for

    log = fleet.run_dir("ct200") / "train.log"
    wait_for(lambda: log.exists() and log.stat().st_size > 100_000_000, 60, what="the 100 MB line")
    paths = ["host", "container"] if fleet.info.isolation == "lxc" else ["container"]
    got = {}
    for path in paths:  # each way of reading the container: from its host, from inside
        m = subprocess.run(
            [sys.executable, "-c", _MEASURE, str(fleet.config), path],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=ROOT,
        )
        assert "Traceback" not in m.stderr, m.stderr[-3000:]
        got[path] = json.loads(m.stdout.strip().splitlines()[-1])
    res = fleet.orch("check", "ct200", "--json", "--db", str(tmp_path / "orch.db"))
    t = json.loads(res.stdout)["targets"][0]
    seen = "; ".join(
        f"from the {p}: error {g['error']!r}, orch peak RSS "
        f"+{g['peak_growth_mib']:.0f} MiB ({g['took_s']:.1f} s)"
        for p, g in got.items()
    )
    observe(f"{seen}; check: state {t['state']!r}, findings {[f['kind'] for f in t['findings']]}")
    for g in got.values():
        assert g["error"] is None, got
        assert g["peak_growth_mib"] < 64, got
    assert t["reachable"] and "agent-protocol-error" not in [f["kind"] for f in t["findings"]]


BAD_PLAYBOOK = """\
id: broken-regex
title: A signature with a bad regex
kind: signature
severity: critical
match:
  log:
    - "fine line"
    - "(unclosed group"
diagnosis: |
  Never loads.
"""


@pytest.mark.fault(
    area="hostile input",
    fault="a playbook file with a bad regex",
    must="one ConfigError naming file:line at load; `orch diagnose --playbooks` exits 2 "
    "with one error line, no traceback",
)
def test_bad_playbook_regex_names_file_and_line(observe, tmp_path):
    from orchestrator.errors import ConfigError
    from orchestrator.playbooks.loader import load_playbooks

    d = tmp_path / "pb"
    d.mkdir()
    (d / "broken.yaml").write_text(BAD_PLAYBOOK)
    with pytest.raises(ConfigError) as err:
        load_playbooks(d)
    msg = str(err.value)
    log = tmp_path / "some.log"
    log.write_text("hello\n")
    res = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "diagnose", str(log), "--playbooks", str(d)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    shown = msg.replace(str(tmp_path), "TMP")
    err_line = res.stderr.strip().replace(str(tmp_path), "TMP")
    observe(f"load: {shown[:110]!r}; orch diagnose exit {res.returncode}: {err_line[:90]!r}")
    assert f"{d / 'broken.yaml'}:8" in msg, msg
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.fault(
    area="hostile input",
    fault="an unknown command-line option (`orch check --no-such-flag`)",
    must="a one-line usage error, exit 2, no traceback",
)
def test_unknown_cli_option_is_a_usage_error(observe):
    res = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "check", "--no-such-flag"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
    observe(f"exit {res.returncode}; last stderr line {last[:100]!r}")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-1500:]


def test_hostile_script_passes_deploy_through(hostile):
    """Self-check: with no mode set, the hostile python is a plain python3 (deploy works)."""
    config, mode_file, path = hostile
    mode_file.write_text("")
    from orchestrator.config.inventory import load_inventory
    from orchestrator.remote.hostlink import HostLink
    from orchestrator.remote.target import Target

    inv = load_inventory(Path(config))
    if path == "host":
        doc = HostLink(inv, "sandbox", ["ct200"]).observe(timeout=60)
        assert doc.containers["ct200"].container_status == "running", doc
    else:
        assert Target(inv, "ct200").snapshot().reachable

"""A real Nagios core (Debian's nagios4-core) runs ``orch check`` against the sandbox as a
service check; its status.dat holds orch's status line and performance data.

Skipped when nagios4 is not installed (./dev installs it: nagios4-core).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.views.nagios_format import parse_perfdata

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NAGIOS = shutil.which("nagios4") or "/usr/sbin/nagios4"
CHECK_DUMMY = Path("/usr/lib/nagios/plugins/check_dummy")  # monitoring-plugins-basic

needs_nagios = pytest.mark.skipif(
    not Path(NAGIOS).exists(), reason="nagios4 not installed (apt: nagios4-core)"
)

_TIMEPERIOD = "\n".join(
    ["define timeperiod {", "  timeperiod_name always", "  alias always"]
    + [
        f"  {d} 00:00-24:00"
        for d in ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
    ]
    + ["}"]
)


def _config(where: Path, plugin: Path) -> Path:
    """A minimal Nagios 4 configuration: one host, one service running ``plugin`` each
    minute, every check at once on start, status.dat rewritten each second."""
    host_check = f"{CHECK_DUMMY} 0 up" if CHECK_DUMMY.exists() else "/bin/true"
    (where / "results").mkdir()
    objects = where / "objects.cfg"
    objects.write_text(f"""{_TIMEPERIOD}
define command {{
  command_name orch_check
  command_line {plugin}
}}
define command {{
  command_name host_up
  command_line {host_check}
}}
define contact {{
  contact_name nobody
  host_notifications_enabled 0
  service_notifications_enabled 0
  host_notification_period always
  service_notification_period always
  host_notification_options n
  service_notification_options n
  host_notification_commands host_up
  service_notification_commands host_up
}}
define host {{
  host_name sandbox
  address 127.0.0.1
  check_command host_up
  max_check_attempts 1
  check_period always
  contacts nobody
  notification_period always
}}
define service {{
  host_name sandbox
  service_description orch
  check_command orch_check
  max_check_attempts 1
  check_interval 1
  retry_interval 1
  check_period always
  contacts nobody
  notification_period always
}}
""")
    user = os.environ.get("USER") or "root"
    main = where / "nagios.cfg"
    main.write_text(
        "\n".join(
            [
                f"log_file={where / 'nagios.log'}",
                f"cfg_file={objects}",
                f"status_file={where / 'status.dat'}",
                "status_update_interval=1",
                f"temp_file={where / 'nagios.tmp'}",
                f"temp_path={where}",
                f"lock_file={where / 'nagios.lock'}",
                f"state_retention_file={where / 'retention.dat'}",
                "retain_state_information=0",
                f"check_result_path={where / 'results'}",
                f"object_cache_file={where / 'objects.cache'}",
                f"precached_object_file={where / 'objects.precache'}",
                f"command_file={where / 'nagios.cmd'}",
                "check_external_commands=0",
                f"nagios_user={user}",
                f"nagios_group={user}",
                "service_inter_check_delay_method=n",
                "host_inter_check_delay_method=n",
                "max_service_check_spread=1",
                "service_check_timeout=120",
                "enable_notifications=0",
                "enable_event_handlers=0",
                "",
            ]
        )
    )
    return main


def _service(status: Path) -> dict[str, str] | None:
    """The ``servicestatus`` block of status.dat, once the service has been checked."""
    if not status.exists():
        return None
    for block in re.findall(r"servicestatus \{\n(.*?)\n\s*\}", status.read_text(), re.S):
        fields = dict(line.strip().split("=", 1) for line in block.splitlines() if "=" in line)
        if fields.get("has_been_checked") == "1":
            return fields
    return None


def _plugin(where: Path, fleet, db: Path) -> Path:  # type: ignore[no-untyped-def]
    """``orch check`` as Nagios runs a plugin: a script with this test's environment."""
    env = {k: v for k, v in os.environ.items() if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)}
    argv = [
        sys.executable,
        "-m",
        "orchestrator.cli",
        "-c",
        fleet.config,
        "check",
        "--db",
        str(db),
        "--timeout",
        "30",
    ]
    script = where / "orch_check.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"cd {shlex.quote(str(ROOT))} || exit 3\n"
        f"exec env -i {' '.join(shlex.quote(f'{k}={v}') for k, v in sorted(env.items()))} "
        f"{shlex.join(argv)}\n"
    )
    script.chmod(0o755)
    return script


@needs_nagios
def test_nagios_core_stores_orchs_perfdata(fleet, tmp_path):  # type: ignore[no-untyped-def]
    fleet.scenario("healthy")
    fleet.launch("ct200")
    where = tmp_path / "nagios"
    where.mkdir()
    cfg = _config(where, _plugin(where, fleet, tmp_path / "orch.db"))
    verify = subprocess.run([NAGIOS, "-v", str(cfg)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout[-3000:]
    core = subprocess.Popen(
        [NAGIOS, str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        svc = wait_for(lambda: _service(where / "status.dat"), 150, what="Nagios's first check")
    finally:
        core.terminate()
        core.wait(timeout=30)
    assert svc["current_state"] == "0", svc
    assert svc["plugin_output"].startswith("ORCH OK - 2 targets"), svc
    items = {i.label: i for i in parse_perfdata(svc["performance_data"])}
    assert (items["targets"].value, items["targets_ok"].value) == (2, 2), items
    assert items["targets_critical"].value == 0 and items["findings"].value == 0
    assert {f"ct200_gpu{i}_util" for i in range(8)} | {"ct200_gpu0_mem"} <= set(items), items
    assert items["ct200_gpu0_util"].uom == "%" and items["ct200_gpu0_mem"].uom == "B"

"""Every reader of a container's files, fed random bytes and random JSON: no exception
escapes, and nothing changes without a finding (a property test, hypothesis).

The readers: the run facts (:class:`~orchestrator.agent.runfacts.RunReader`: runs/current,
manifest.json, train.log, exit_status, stop_requested, the metrics in the log), the host
view's pid files (``wrapper.pid``, ``tmux.pid``, ``pgid``), the postmortem's metrics.jsonl
records, the bounded JSON parser and the wire's ``from_dict``; then the detectors and the
state word over what they produced.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.agent.containerview import parse_pid_file
from orchestrator.agent.rundir import parse_exit_status, parse_run_id, parse_stop_request
from orchestrator.agent.runfacts import LocalFiles, RunReader
from orchestrator.config.limits import Limits
from orchestrator.detect.engine import run_detectors
from orchestrator.monitor.state import target_state
from orchestrator.postmortem.evidence import checked_records
from orchestrator.wire.model import Metrics, RunManifest, SchemaError, Snapshot
from orchestrator.wire.text import BAD_DATA_PREFIX, MAX_STEP, BadDocument, loads_bounded

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=20),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
)
documents = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)
nasty_text = st.one_of(
    st.binary(max_size=300),
    st.just(b"[" * 5000),
    st.just(b'{"a":' * 3000),
    st.builds(lambda n: f"step={'9' * n} loss=2.0\n".encode(), st.integers(1, 500)),
    st.builds(lambda d: json.dumps(d, default=str).encode(), documents),
)
MANIFEST_KEYS = ("run_id", "command", "workdir", "session", "started_at", "gpus", "env")


def _manifest_like():  # type: ignore[no-untyped-def]
    return st.fixed_dictionaries({}, optional={k: documents for k in MANIFEST_KEYS})


def _run_dir(root: Path, files: dict[str, bytes]) -> Path:
    run = root / "runs" / "20260101-000000-x"
    run.mkdir(parents=True, exist_ok=True)
    (root / "runs" / "current").write_text("20260101-000000-x\n")
    for name, data in files.items():
        (run / name).write_bytes(data)
    return run


@SETTINGS
@given(
    manifest=st.one_of(
        nasty_text, _manifest_like().map(lambda d: json.dumps(d, default=str).encode())
    ),
    log=nasty_text,
    exit_status=nasty_text,
    stop=nasty_text,
)
def test_the_run_reader_never_raises_and_says_what_it_dropped(
    manifest, log, exit_status, stop
) -> None:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        _run_dir(
            root,
            {
                "manifest.json": manifest,
                "train.log": log + b"\n",
                "exit_status": exit_status,
                "stop_requested": stop,
            },
        )
        reader = RunReader(str(root), LocalFiles())
        errors: list[str] = []
        run, _ = reader.read(1.7e9, errors)
        assert run is not None  # the run never vanishes for what its files hold
        m = reader.last_metrics
        if m is not None and m.step is not None:
            assert isinstance(m.step, int) and 0 <= m.step < MAX_STEP
        snap = Snapshot("ct", 1.7e9, run=run, metrics=m, errors=tuple(errors))
        Snapshot.from_dict(
            json.loads(json.dumps(snap.to_dict()))
        )  # what goes on the wire reads back
        findings = run_detectors([snap], limits=Limits(), playbooks=())
        state = target_state(snap, findings)
        assert state not in ("idle", "connecting", "unreachable"), state
        if any(e.startswith(BAD_DATA_PREFIX) for e in errors):
            assert "bad-metrics" in {f.kind for f in findings}


@SETTINGS
@given(data=st.binary(max_size=200))
def test_the_small_file_parsers_never_raise(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    parse_pid_file(data)
    parse_exit_status(text)
    parse_run_id(text)
    parse_stop_request(text)


@SETTINGS
@given(records=st.lists(documents, max_size=8))
def test_metrics_records_are_kept_only_when_plausible(records) -> None:  # type: ignore[no-untyped-def]
    kept, why = checked_records(records)
    assert len(kept) + (0 if why is None else int(why.split(": ")[2].split(" of ")[0])) == len(
        records
    )
    for r in kept:
        assert 946684800 <= r["time"] <= 4102444800


@SETTINGS
@given(doc=documents, raw=st.binary(max_size=300))
def test_bounded_json_and_from_dict_fail_only_with_their_own_errors(doc, raw) -> None:  # type: ignore[no-untyped-def]
    for text in (raw, json.dumps(doc, default=str)):
        with contextlib.suppress(BadDocument):
            loads_bounded(text)
    for cls in (RunManifest, Metrics, Snapshot):
        with contextlib.suppress(SchemaError):
            cls.from_dict(doc)


def test_a_deep_document_is_a_bad_document_not_a_recursion_error() -> None:
    for text in ("[" * 5000, '{"a":' * 5000, "[" * 100 + "]" * 100):
        try:
            loads_bounded(text)
        except BadDocument as exc:
            assert "nested deeper" in str(exc) or "not JSON" in str(exc)
        else:
            raise AssertionError("accepted")


def test_a_400_digit_step_is_dropped_with_a_finding_and_the_run_stays_running(
    tmp_path: Path,
) -> None:
    _run_dir(
        tmp_path,
        {
            "manifest.json": json.dumps(
                {
                    "run_id": "20260101-000000-x",
                    "command": "x",
                    "workdir": str(tmp_path),
                    "session": "train",
                    "started_at": 1.7e9,
                }
            ).encode(),
            "train.log": f"step={'9' * 400} loss=2\n".encode(),
        },
    )
    reader = RunReader(str(tmp_path), LocalFiles())
    errors: list[str] = []
    run, _ = reader.read(1.7e9 + 5, errors)
    assert run is not None and run.manifest is not None
    assert reader.last_metrics is None or reader.last_metrics.step is None
    # the parser may drop the line (an overflow) or the value (out of range): either is said
    assert any("train.log metrics" in e and e.startswith(BAD_DATA_PREFIX) for e in errors), errors

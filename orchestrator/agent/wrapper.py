"""The wrapper script every run is started through (``env -i bash wrapper.sh RUN_DIR``): tee
logging, the exit status written even on a full disk, the exit line, the recorder stopped.

Kept apart from :mod:`orchestrator.agent.runs` (which writes it into each run directory) so the
shell text reads as one piece. Its settings come from files in the run directory; no value is
pasted into it.
"""

from __future__ import annotations

from orchestrator.agent.rundir import ENV, STATUS_RESERVE, TEE_ERR
from orchestrator.wire import requests as rq

GO_TIMEOUT_S = 30.0
"""Seconds the wrapper waits for the launcher's go before giving up (exit 125)."""


# Seed 000: an `exec` in the start script bypassed tee and no log was ever written.
# Nothing below may put `exec` in front of the pipeline; tests/launch check the log exists.
WRAPPER = r"""#!/usr/bin/env bash
# Written by orch (orchestrator/agent/wrapper.py). Started as `env -i bash wrapper.sh RUN_DIR`;
# settings come from files in the run directory; no value is pasted into this text.
set -o pipefail
set -m  # background jobs get their own process group: `orch stop` signals the command, not tee
RUN_DIR="${1:?usage: wrapper.sh RUN_DIR}"
LOG="$RUN_DIR/train.log"
put() { printf '%s\n' "$2" >"$RUN_DIR/.$1.tmp" && mv -f "$RUN_DIR/.$1.tmp" "$RUN_DIR/$1"; }
# A full disk takes no new file: the status then overwrites the blanks reserved at launch (in
# place, no new block) and that file is renamed. Readers strip the blanks (int(" 1\n  ") works).
put_status() {
  put exit_status "$1" 2>/dev/null && return
  rm -f "$RUN_DIR/.exit_status.tmp"
  [[ -f "$RUN_DIR/__RESERVE__" ]] && printf '%s\n' "$1" 1<>"$RUN_DIR/__RESERVE__" &&
    mv -f "$RUN_DIR/__RESERVE__" "$RUN_DIR/exit_status"
}
early() { put_status "$1"; exit "$1"; }
trap 'early 130' INT
trap 'early 143' TERM
trap 'early 129' HUP
# The run's whole environment (PATH, HOME, LANG, hosts.yaml's env, --env, ORCH_*): NAME=VALUE
# records ending in NUL, in a 0600 file, so no value was ever on a command line (ps shows argv).
if [[ ! -r "$RUN_DIR/__ENV__" ]]; then
  echo "orch: $RUN_DIR/__ENV__ is missing; nothing was started" >&2
  early 125
fi
while IFS= read -r -d '' kv; do export -- "$kv" || echo "orch: could not set ${kv%%=*}" >&2; done \
  <"$RUN_DIR/__ENV__"
# The launcher says go once remain-on-exit and history-limit are in force.
for ((i = 0; i < __GO_TICKS__; i++)); do [[ -e "$RUN_DIR/go" ]] && break; sleep 0.05; done
if [[ ! -e "$RUN_DIR/go" ]]; then
  echo "orch: the launcher never said go; nothing was started" >&2
  early 125
fi
: >>"$LOG"
# Hold the pane's tty until this shell is gone, so tmux reaps it before it sees EOF: tmux with
# libutempter loses a SIGCHLD that arrives while it handles EOF (no pane_dead_status/signal).
ME=$$
( trap '' INT TERM HUP; while kill -0 "$ME" 2>/dev/null; do sleep 0.2; done ) &
CMD=$(<"$RUN_DIR/command")
(
  trap : INT TERM HUP  # caught, not ignored, so the command gets default handling
  # tee's stderr ("tee: train.log: No space left on device") goes into the reserved blanks of
  # __TEE_ERR__ (<> opens without truncating), not the pane, where it would scroll away.
  bash -c "$CMD" </dev/null 2>&1 |
    { trap '' INT TERM HUP; tee -a "$LOG" 2<>"$RUN_DIR/__TEE_ERR__"; }
  sts=("${PIPESTATUS[@]}")
  st=${sts[0]} ts=${sts[1]:-0}
  if [[ "$ts" != 0 ]]; then
    printf '%s\n' "$ts" >"$RUN_DIR/tee_status" 2>/dev/null
    echo "[orch] tee exited with status $ts; train.log may be incomplete:"
    while IFS= read -r l || [[ -n "$l" ]]; do
      [[ "$l" == *[![:space:]]* ]] && printf '[orch] %s\n' "$l"
    done <"$RUN_DIR/__TEE_ERR__"
  fi
  printf '%s\n' "$st" >"$RUN_DIR/.pipestatus"
  exit "$st"
)&
JOB=$!
GOT=
forward() { GOT=$1; kill -s "$1" -- "-$JOB" 2>/dev/null; }
trap 'forward INT' INT
trap 'forward TERM' TERM
trap 'forward HUP' HUP
put pgid "$JOB"
REC=
if [[ -n "${ORCH_AGENT_PATH:-}" ]]; then
  "${ORCH_AGENT_PYTHON:-python3}" -S -c 'import sys; sys.path.insert(0, sys.argv.pop(1))
from orchestrator.agent.__main__ import main; sys.exit(main())' "$ORCH_AGENT_PATH" record \
    --run-dir "$RUN_DIR" --interval "${ORCH_RECORD_INTERVAL_S:-2}" --pid "$JOB" \
    </dev/null >>"$RUN_DIR/recorder.log" 2>&1 &
  REC=$!
fi
# From here the wrapper says nothing on stderr: bash's own report of the job it waits for
# ("wrapper.sh: line N: PID Killed ( trap ...") is not the command's output, and log-signature
# playbooks would read it as such. Its own lines go to stdout with an [orch] prefix.
exec 2>/dev/null
while :; do
  GOT=
  wait "$JOB"
  st=$?
  [[ -z "$GOT" ]] && break
done
[[ -s "$RUN_DIR/.pipestatus" ]] && st=$(<"$RUN_DIR/.pipestatus")
# The pane's last line first, then the status: whoever sees exit_status (postmortem's pane capture
# follows it) finds the line already written to the pane.
printf '\n__EXIT_LINE__ %s at %s\n' "$st" "$(date '+%F %T')"
put_status "$st"
if [[ -n "$REC" ]]; then kill -TERM "$REC" 2>/dev/null; wait "$REC" 2>/dev/null; fi
exit "$st"
""".replace("__GO_TICKS__", str(int(GO_TIMEOUT_S / 0.05))).replace("__EXIT_LINE__", rq.EXIT_LINE)
WRAPPER = (
    WRAPPER.replace("__RESERVE__", STATUS_RESERVE)
    .replace("__TEE_ERR__", TEE_ERR)
    .replace("__ENV__", ENV)
)

"""The monitor layer between ``target.py`` and the views: observations, history, detection,
the target state, ``history`` (SQLite) and ``alerts``. Views render what it concludes."""

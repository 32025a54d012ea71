"""CheckRecord's JSON round trip: what the store writes reads back equal, and rows written by older releases or
damaged on disk read as a record with the bad fields unset (or none at all), never as an exception."""

from __future__ import annotations

import json
import math

import pytest

from bot.core.records import CheckRecord


def test_round_trip_keeps_every_set_field():
    rec = CheckRecord(
        t=1700000000.5, marker="Load weight end", last_progress_t=1699999990.0, log_bytes=4096, log_lines=17,
        gpu_mem_mib={"0": 70000.0, "1": None}, gpu_util_pct={"0": 0.0}, gpu_power_w={"0": 120.5},
        cpu_s={"4242": 12.5}, alive=True, port_open=False, health="timeout", exit_status=-9,
        log_cursor=[123, 4096, "abc"], verdict="silent_hang", phase="weights_loading",
    )
    back = CheckRecord.from_json(json.loads(json.dumps(rec.as_json())))
    assert back == rec


def test_as_json_leaves_out_unset_fields():
    out = CheckRecord.failed(12.0, "ssh: connection refused").as_json()
    assert out == {"t": 12.0, "error": "ssh: connection refused", "gpu_mem_mib": {}, "gpu_util_pct": {},
                   "gpu_power_w": {}, "cpu_s": {}}
    assert not CheckRecord.failed(12.0, "x").ok
    assert CheckRecord(t=1.0).ok


@pytest.mark.parametrize("data", [None, [], "t=1", {}, {"t": "12"}, {"t": True}, {"t": math.nan},
                                  {"t": math.inf}, {"marker": "x"}])
def test_rows_without_a_finite_time_are_not_records(data):
    assert CheckRecord.from_json(data) is None


def test_older_or_damaged_rows_read_with_bad_fields_unset():
    rec = CheckRecord.from_json({
        "t": 5, "marker": 7, "log_bytes": "4096", "log_lines": True, "alive": 1, "port_open": True,
        "exit_status": False, "gpu_mem_mib": {"0": 512, "1": "n/a", 2: 3.5, "3": True, "²": 5.0}, "cpu_s": ["1"],
        "verdict": "ready", "removed_in_a_later_release": 1,
    })
    assert rec is not None
    assert rec.t == 5.0 and isinstance(rec.t, float)
    assert rec.marker is None and rec.log_bytes is None and rec.log_lines is None
    assert rec.alive is None and rec.port_open is True and rec.exit_status is None
    assert rec.gpu_mem_mib == {"0": 512, "2": 3.5}
    assert rec.cpu_s == {}
    assert rec.verdict == "ready"


@pytest.mark.parametrize("damage", ["state = 'zombie'", "params_json = '{oops'", "gpus_json = '[1,'"])
def test_a_damaged_launch_row_is_skipped_and_the_others_still_read(tmp_path, damage):
    import sqlite3

    from bot.adapters.store import Store

    url = f"sqlite:///{tmp_path}/gpubot.db"
    store = Store(url)
    try:
        ids = [store.launches.create(host="h", variant="base", params={}, command="c", log_path=None, port=None,
                                     gpus=[0], created_by="U1").id for _ in range(3)]
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "gpubot.db") as db:
        db.execute(f"UPDATE launches SET {damage} WHERE id = ?", (ids[0],))
    store = Store(url)
    try:
        assert [la.id for la in store.launches.recent()] == [ids[2], ids[1]]
        assert store.launches.get(ids[0]) is None and store.launches.get(ids[1]) is not None
        assert [la.id for la in store.launches.live()] == [ids[2], ids[1]]
    finally:
        store.close()


def test_a_launch_written_is_read_again_and_the_others_stay_as_read(tmp_path):
    from bot.adapters.store import Store

    store = Store(f"sqlite:///{tmp_path}/gpubot.db")
    try:
        a, b = (store.launches.create(host="h", variant="base", params={}, command="c", log_path=None, port=None,
                                      gpus=[0], created_by="U1") for _ in range(2))
        assert store.launches.get(a.id).pid is None and store.launches.get(b.id).pid is None
        store.launches.update(a.id, pid=4242)
        store.launches.update(b.id, alert_state="loading")
        assert store.launches.get(a.id).pid == 4242 and store.launches.get(b.id).alert_state == "loading"
        store.launches.update(a.id, alert_state="ready")
        assert store.launches.get(b.id).alert_state == "loading"  # b was not written: as read
        assert [la.alert_state for la in store.launches.recent()] == ["loading", "ready"]  # lists read again
        store.launches.update(a.id, thread_ts="q:1")
        assert store.launches.get(a.id).thread_ts == "q:1"
        assert store.launches.replace_thread_ts("q:1", "2.2") == 1  # a write of any launch: all are read again
        assert store.launches.get(a.id).thread_ts == "2.2" and store.launches.get(b.id).alert_state == "loading"
    finally:
        store.close()

import contextlib
import json
import os

from hsmon.contracts import events, layout
from hsmon.contracts.manifest_reader import read_manifest
from hsmon.contracts.units import format_bytes, parse_size


def test_event_writer_flushes_each_line(tmp_path):
    path = tmp_path / "ev.jsonl"
    writer = events.EventWriter("job1", path)
    writer.emit(events.START, rows_total=3)
    # another reader sees the line before close: flushed per line
    assert json.loads(path.read_text())["rows_total"] == 3
    writer.close()


def test_reader_handles_partial_garbage_truncation_rotation(tmp_path):
    path = tmp_path / "ev.jsonl"
    reader = events.EventFileReader(str(path))
    assert reader.poll() == []  # missing file
    path.write_text('{"kind":"start","job":"j"}\nnot json\n{"kind":"ro')
    got = reader.poll()
    assert [e["kind"] for e in got] == ["start"] and reader.bad_lines == 1
    with open(path, "a") as fh:
        fh.write('ws","rows_done":5}\n')
    assert reader.poll()[0]["rows_done"] == 5
    path.write_text('{"kind":"done"}\n')  # truncated and rewritten (smaller)
    assert [e["kind"] for e in reader.poll()] == ["done"]
    os.rename(path, tmp_path / "old")
    path.write_text('{"kind":"heartbeat"}\n{"kind":"heartbeat"}\n{"kind":"error"}\n')
    assert len(reader.poll()) == 3 and reader.rotations >= 1


def test_manifest_ignores_partial_line(tmp_path):
    m = tmp_path / layout.MANIFEST_NAME
    layout.append_jsonl(m, [{"type": "row", "row": 4, "chunk": "rows_0-2000", "tokens": 9, "bytes": 10}])
    with open(m, "a") as fh:
        fh.write('{"type":"row","row":5')
    state = read_manifest(tmp_path)
    assert set(state.rows) == {4} and state.tokens == 9
    assert layout.row_path(tmp_path, 4001).parts[-2:] == ("rows_4000-6000", "data_4001.ckpt")


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "rows_0-2000" / "data_0.ckpt"

    def boom(fh):
        fh.write(b"half")
        raise RuntimeError("crash")

    with contextlib.suppress(RuntimeError):
        layout.atomic_write(target, boom)
    assert not target.exists() and list(target.parent.iterdir()) == []
    assert layout.atomic_write(target, lambda fh: fh.write(b"12345")) == 5


def test_sizes():
    assert parse_size("10G") == 10_000_000_000
    assert parse_size("2GiB") == 2 * 1024**3
    assert format_bytes(1_500_000) == "1.5 MB"

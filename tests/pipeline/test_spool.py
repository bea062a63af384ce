"""The exporters' on-disk journal, on real files in a temporary directory."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from pipeline._spool import Spool, read_frames


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("segment-*.spool"))


def test_it_replays_what_was_not_done(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    assert spool.open() == []
    seqs = spool.append([b"a", b"b", b"c", b"d"])
    spool.done([seqs[0], seqs[2]])
    spool.commit()
    spool.close()
    again = Spool(tmp_path)
    assert again.open() == [(seqs[1], b"b"), (seqs[3], b"d")]
    assert again.replayed == 2
    fresh = again.append([b"e"])
    assert fresh[0] > seqs[3]  # sequence numbers keep growing across restarts
    again.close()


def test_it_skips_a_torn_last_frame(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.open()
    spool.append([b"first", b"second", b"third" * 100])
    spool.close()
    (segment,) = segments(tmp_path)
    segment.write_bytes(segment.read_bytes()[:-50])  # crashed halfway through "third"
    again = Spool(tmp_path)
    assert [payload for _, payload in again.open()] == [b"first", b"second"]
    assert again.torn == 1
    again.close()


def test_it_stops_reading_a_segment_at_a_damaged_frame(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.open()
    spool.append([b"one", b"two", b"three"])
    spool.close()
    (segment,) = segments(tmp_path)
    data = bytearray(segment.read_bytes())
    data[data.index(b"two")] ^= 0xFF  # a flipped bit: the CRC no longer matches
    segment.write_bytes(bytes(data))
    frames, damaged = read_frames(bytes(data))
    assert damaged and [payload for _, _, payload in frames] == [b"one"]


@pytest.mark.parametrize("junk", [b"", b"P", b"XX" + b"\x00" * 40, b"PJ\x01\xff\xff\xff\xff" + b"\x00" * 20])
def test_it_reads_junk_as_no_frames_without_raising(junk: bytes) -> None:
    frames, damaged = read_frames(junk)
    assert frames == [] and damaged == bool(junk)


def test_it_deletes_segments_once_everything_in_them_is_done(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=200)
    spool.open()
    seqs = [spool.append([bytes([65 + i]) * 60])[0] for i in range(10)]
    assert len(segments(tmp_path)) > 3
    spool.done(seqs[:5])
    kept = segments(tmp_path)
    spool.done(seqs[5:])
    assert len(segments(tmp_path)) < len(kept)
    assert len(segments(tmp_path)) == 1  # only the one being appended to
    spool.close()
    assert Spool(tmp_path).open() == []


def test_it_keeps_an_older_segment_while_a_newer_one_cancels_part_of_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=100)
    spool.open()
    first = spool.append([b"x" * 80])[0]
    second = spool.append([b"y" * 80])[0]
    spool.done([second])  # the done mark of "y" lands in a newer segment than "x"
    spool.close()
    assert [seq for seq, _ in Spool(tmp_path).open()] == [first]


def test_it_keeps_to_its_size_bound_and_says_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path, max_bytes=1_000)
    spool.open()
    with caplog.at_level(logging.WARNING, logger="pipeline.exporter"):
        seqs = spool.append([b"z" * 300 for _ in range(5)])
        more = spool.append([b"z" * 300])
    assert seqs[:3] != [None] * 3 and seqs[3:] == [None, None] and more == [None]
    assert spool.skipped == 3 and spool.size_bytes <= 1_000
    assert len([r for r in caplog.records if "full" in r.getMessage()]) == 1
    spool.close()


def test_it_turns_itself_off_when_the_disk_is_full_with_dev_full(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path)
    spool.open()
    full = os.open("/dev/full", os.O_WRONLY)  # the disk, as it answers when it is full
    os.dup2(full, spool._active_fd)
    os.close(full)
    with caplog.at_level(logging.WARNING, logger="pipeline.exporter"):
        assert spool.append([b"lost to the disk"]) == [None]
        assert spool.append([b"never tried"]) == [None]
        spool.done([1])
    assert (spool.enabled, spool.errors, spool.skipped) == (False, 1, 1)
    assert len(caplog.records) == 1 and "No space" in caplog.records[0].getMessage()


def test_it_does_not_open_a_directory_another_spool_holds(tmp_path: Path) -> None:
    first = Spool(tmp_path)
    first.open()
    second = Spool(tmp_path)
    assert second.open() == [] and not second.enabled and second.errors == 1
    first.close()
    third = Spool(tmp_path)
    third.open()
    assert third.enabled
    third.close()


def test_it_writes_files_only_its_owner_can_read(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.open()
    spool.append([b"tool parameters are private"])
    spool.close()
    (segment,) = segments(tmp_path / "spool")
    assert segment.stat().st_mode & 0o077 == 0
    assert (tmp_path / "spool").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("policy", ["always", "batch", "never"])
def test_it_accepts_each_fsync_policy(tmp_path: Path, policy: str) -> None:
    spool = Spool(tmp_path, fsync=policy)  # type: ignore[arg-type]
    spool.open()
    seqs = spool.append([b"a", b"b"])
    spool.commit()
    spool.done(seqs[:1])
    spool.close()
    assert [p for _, p in Spool(tmp_path).open()] == [b"b"]


def test_it_refuses_a_bad_policy_or_bound(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Spool(tmp_path, fsync="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Spool(tmp_path, max_bytes=0)

"""The kernel's word on a vanished process (hsmon/core/trackers/kernel.py): the OOM killer's line in the
kernel log and the memory cgroup's OOM count, read once when the process is gone; an OOM kill reads
`dead` with that line rather than `exited`. The parsers run on records recorded on this machine
(tests/fixtures/kernel: a real memory-cgroup OOM kill of PID 8999, cgroup v1); the last test makes
a real OOM kill in a memory-limited cgroup of its own and watches it with a real `hsmon daemon`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_helpers import Daemon, Procs, child_env, wait_until

from hsmon.core.state import decide
from hsmon.core.state_facts import ProcessFacts, Snapshot
from hsmon.core.trackers.kernel import (
    CgroupWatch,
    kmsg_message,
    memory_cgroup_file,
    oom_evidence,
    oom_kill_count,
    oom_kill_line,
)

FIXTURES = Path(__file__).parent / "fixtures" / "kernel"
KILLED = (
    "Memory cgroup out of memory: Killed process 8999 (python3) total-vm:82364kB, anon-rss:72156kB, "
    "file-rss:2968kB, shmem-rss:0kB, UID:0 pgtables:200kB oom_score_adj:0"
)
# /proc/mounts of this machine (cgroup v1 controllers, cgroup v2 at /sys/fs/cgroup/unified), abridged
MOUNTS_V1 = (
    "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
    "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
    "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
)
CGROUP_V1 = "9:name=systemd:/\n4:memory:/process_api/ff5e/hsmon-probe\n1:cpu:/\n0::/\n"
OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {}\n"
MEMORY_EVENTS = "low 0\nhigh 0\nmax 12\noom 1\noom_kill {}\noom_group_kill 0\n"


def kmsg_records() -> list[str]:
    return (FIXTURES / "kmsg-memcg-oom.txt").read_text().splitlines()


def test_the_oom_killers_line_about_the_pid_is_found_in_recorded_kernel_records():
    records = [kmsg_message(r) for r in kmsg_records()]
    assert records[0] == (541.864046, "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, "
                          "oom_score_adj=0")  # fmt: skip
    assert oom_kill_line(records, 8999) == KILLED
    assert oom_kill_line(records, 899) is None and oom_kill_line(records, 89990) is None  # that PID only
    assert oom_kill_line(records, 8999, since=541.0) == KILLED  # it started before the kill
    assert oom_kill_line(records, 8999, since=542.0) is None  # a later process with the same PID
    global_oom = "Out of memory: Killed process 4242 (python) total-vm:9000kB, anon-rss:8000kB"
    assert oom_kill_line([*records, (None, global_oom)], 4242) == global_oom


def test_oom_counts_of_cgroup_v1_and_v2_files():
    assert oom_kill_count(OOM_CONTROL.format(3)) == 3
    assert oom_kill_count(MEMORY_EVENTS.format(2)) == 2  # not "oom 1" nor "oom_group_kill 0"
    assert oom_kill_count("garbage\n") is None


def test_the_memory_cgroup_file_of_a_process_v1_and_v2(tmp_path):
    assert memory_cgroup_file(CGROUP_V1, MOUNTS_V1) == Path(
        "/sys/fs/cgroup/memory/process_api/ff5e/hsmon-probe/memory.oom_control"
    )
    v2 = tmp_path / "cg2"
    (v2 / "job.slice").mkdir(parents=True)
    (v2 / "job.slice" / "memory.events").write_text(MEMORY_EVENTS.format(0))
    mounts = f"cgroup2 {v2} cgroup2 rw,nosuid 0 0\n"
    assert memory_cgroup_file("0::/job.slice\n", mounts) == v2 / "job.slice" / "memory.events"
    (v2 / "job.slice" / "memory.events.local").write_text(MEMORY_EVENTS.format(0))  # its own kills only
    assert memory_cgroup_file("0::/job.slice\n", mounts) == v2 / "job.slice" / "memory.events.local"
    assert memory_cgroup_file("0::/elsewhere\n", mounts) is None  # no memory controller there
    assert memory_cgroup_file("0::/\n", "proc /proc proc rw 0 0\n") is None


def test_a_cgroup_oom_count_that_rose_while_the_process_ran_is_evidence(tmp_path):
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    cg = tmp_path / "cg2" / "job"
    cg.mkdir(parents=True)
    (proc / "mounts").write_text(f"cgroup2 {tmp_path / 'cg2'} cgroup2 rw 0 0\n")
    (proc / "77" / "cgroup").write_text("0::/job\n")
    (proc / "77" / "stat").write_text("77 (python -u x.py) S 1 77 77 0 -1 4194304 " + "0 " * 12 + "12345 0\n")
    for pid, ppid in ((78, 77), (79, 1)):  # 78 is its child, 79 is not
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "stat").write_text(f"{pid} (python) S {ppid} {pid} {pid} 0 -1\n")
    (cg / "memory.events").write_text(MEMORY_EVENTS.format(1))
    (cg / "cgroup.procs").write_text("77\n78\n")
    watch = CgroupWatch.of(77, proc=str(proc))
    assert watch.count == 1 and watch.started == 12345 / os.sysconf("SC_CLK_TCK")
    no_kmsg = str(tmp_path / "no-kmsg")  # the kernel log not readable (not root)
    assert not oom_evidence(watch, kmsg=no_kmsg).killed
    (cg / "memory.events").write_text(MEMORY_EVENTS.format(2))
    evidence = oom_evidence(watch, kmsg=no_kmsg)
    assert evidence.killed and evidence.line is None and evidence.hint is None  # a cgroup of its own
    assert evidence.reason() == (f"its memory cgroup {cg} (it held only PID 77 and its descendants at every "
                                 "look) counted 1 OOM kill(s) while it ran (oom_kill 1 -> 2)")  # fmt: skip

    (cg / "memory.events").write_text(MEMORY_EVENTS.format(1))
    shared = CgroupWatch.of(77, proc=str(proc))
    (cg / "cgroup.procs").write_text("77\n78\n79\n")  # a process not of the job joins
    shared.look()
    (cg / "memory.events").write_text(MEMORY_EVENTS.format(2))
    evidence = oom_evidence(shared, kmsg=no_kmsg)
    assert not evidence.killed and evidence.hint is not None
    assert "(shared: it holds PID 79, not this job's process or a descendant of it) counted 1" in (
        evidence.hint)


def _gone(**facts) -> Snapshot:
    proc = ProcessFacts("extractor", 8999, False, "gone", seen_alive=True, **facts)
    return Snapshot(now=1000.0, stall_after=60.0, watch_start_ts=0.0, processes=[proc], process_watched=True,
                    exit_log="/tmp/x.log", exit_log_tail=[])  # fmt: skip


def test_an_oom_kill_reads_dead_with_the_kernels_line_not_exited():
    assert decide(_gone()).state == "exited"  # the empty, buffered log alone says nothing
    d = decide(_gone(oom_kill=KILLED))
    assert d.state == "dead" and d.reason == f"extractor PID 8999 was killed by the kernel: {KILLED}"
    hint = next(h for h in d.hints if h.id == "dead")
    assert hint.severity == "critical" and "OOM killer" in hint.message


def _own_memory_cgroup() -> Path:
    """A fresh memory-limited cgroup under this process's own (cgroup v1 memory, or v2), or skip."""
    if os.geteuid() != 0:
        pytest.skip("not root: cannot make a memory cgroup")
    mounts = Path("/proc/mounts").read_text()
    found = memory_cgroup_file(Path("/proc/self/cgroup").read_text(), mounts)
    if found is None:
        pytest.skip("no memory cgroup controller for this process (neither v1 nor v2)")
    child = found.parent / f"hsmon-test-{os.getpid()}"
    try:
        child.mkdir()
        limit = 64 * 1024 * 1024
        if found.name == "memory.oom_control":
            (child / "memory.limit_in_bytes").write_text(str(limit))
        else:
            (child / "memory.max").write_text(str(limit))
            (child / "memory.swap.max").write_text("0")
    except OSError as exc:
        if child.exists():
            child.rmdir()
        pytest.skip(f"cannot make a memory-limited cgroup under {found.parent}: {exc}")
    return child


def test_a_real_oom_kill_in_a_memory_limited_cgroup_reads_dead_with_the_kernels_line(tmp_path):
    """A buffered Python script with its stdout to a file (the original job's empty log) is moved into a
    cgroup limited to 64 MiB, watched by --pid, then allocates 1 GiB: the kernel kills it."""
    cgroup = _own_memory_cgroup()
    procs = Procs()
    log = tmp_path / "victim.log"
    try:
        code = "import sys; print('loading'); sys.stdin.readline(); x = [b'x' * 2**20 for _ in range(1024)]"
        with open(log, "w") as out:
            victim = procs.start([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=out,
                                 stderr=subprocess.STDOUT)  # fmt: skip
        (cgroup / "cgroup.procs").write_text(str(victim.pid))
        daemon = Daemon(procs, tmp_path, ["--job", "victim", "--pid", str(victim.pid), "--stall-after", "60"],
                        env=child_env())  # fmt: skip
        wait_until(lambda: daemon.job("victim")["processes"][0]["alive"], 20, 0.2, what="victim watched")
        time.sleep(1.5)  # a tick or two while it lives (its cgroup is noted at first sight)
        assert victim.stdin is not None
        victim.stdin.write(b"go\n")
        victim.stdin.close()
        assert victim.wait(timeout=60) == -9, "the kernel did not kill it"
        job = wait_until(lambda: (j := daemon.job("victim"))["state"] in ("dead", "exited") and j, 20, 0.2,
                         what="the victim's ending")  # fmt: skip
        assert job["state"] == "dead", job["reason"]
        reason = job["reason"]
        assert reason.startswith(f"extractor PID {victim.pid} was killed by the kernel: "), reason
        if os.access("/dev/kmsg", os.R_OK):  # the kernel log's line, else the cgroup's count
            assert f"out of memory: Killed process {victim.pid} (python" in reason, reason
        else:
            assert f"its memory cgroup {cgroup} counted 1 OOM kill(s)" in reason, reason
        print(f"reason: {job['reason']}")
    finally:
        procs.close()
        _remove_cgroup(cgroup)


def test_a_siblings_oom_kill_in_the_jobs_cgroup_is_a_hint_beside_the_jobs_own_traceback(tmp_path):
    """The job and a sibling share one 64 MiB cgroup (a container's, a pod's): the sibling is
    OOM-killed, then the job dies of a ValueError. dead with the traceback; the OOM count a hint."""
    cgroup = _own_memory_cgroup()
    procs = Procs()
    try:
        hog = "import sys; sys.stdin.readline(); x = [b'x' * 2**20 for _ in range(1024)]"
        job_code = "import sys; print('loading', flush=True); sys.stdin.readline(); raise ValueError('row 7')"
        with open(tmp_path / "job.log", "w") as out:
            job = procs.start([sys.executable, "-c", job_code], stdin=subprocess.PIPE, stdout=out,
                              stderr=subprocess.STDOUT)  # fmt: skip
        sibling = procs.start([sys.executable, "-c", hog], stdin=subprocess.PIPE)
        for pid in (job.pid, sibling.pid):
            (cgroup / "cgroup.procs").write_text(str(pid))
        daemon = Daemon(procs, tmp_path, ["--job", "job", "--pid", str(job.pid), "--stall-after", "60"],
                        env=child_env())  # fmt: skip
        wait_until(lambda: daemon.job("job")["processes"][0]["alive"], 20, 0.2, what="job watched")
        time.sleep(1.5)  # a tick or two while it lives (its cgroup and who is in it are noted)
        for proc in (sibling, job):
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.close()
            proc.wait(timeout=60)
        assert sibling.returncode == -9 and job.returncode == 1
        seen = wait_until(lambda: (j := daemon.job("job"))["state"] in ("dead", "exited") and j, 20, 0.2,
                          what="the job's ending")  # fmt: skip
        assert seen["state"] == "dead", seen["reason"]
        assert seen["reason"] == f"extractor PID {job.pid} failed: ValueError: row 7"
        hint = next(h for h in seen["hints"] if h["id"] == "oom-in-cgroup")
        assert hint["severity"] == "warning" and f"it holds PID {sibling.pid}" in hint["message"]
        assert hint["message"].startswith("the job's cgroup counted an OOM kill (its memory cgroup")
        assert hint["message"].endswith("the job's log ends with a traceback: ValueError: row 7")
    finally:
        procs.close()
        _remove_cgroup(cgroup)


def _remove_cgroup(cgroup: Path) -> None:
    for _ in range(50):  # a killed process leaves the cgroup a moment after it is reaped
        try:
            cgroup.rmdir()
            return
        except OSError:
            time.sleep(0.1)

"""CPU time from /proc: per process tree, for the whole machine, and for reaped children."""

from __future__ import annotations

import os
import resource
from collections import defaultdict
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name; None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Field 3 (state) is index 0 here; ppid is 1, utime 11, stime 12, cutime 13, cstime 14.
    return text.rsplit(")", 1)[1].split()


def process_tree(root: int) -> list[int]:
    """``root`` and all its live descendants (e.g. the sidecar's worker processes)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                children[int(fields[1])].append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def tree_cpu_seconds(root: int) -> float:
    """utime + stime of ``root`` and every live descendant, plus what they reaped
    (cutime + cstime), so a worker that exits mid-run is still counted."""
    ticks = 0
    for pid in process_tree(root):
        fields = _stat(pid)
        if fields is not None:
            ticks += sum(int(v) for v in fields[11:15])
    return ticks / _TICK


def thread_cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid``'s main thread alone (its thread id is its pid)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (user..steal in /proc/stat)."""
    first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICK


def reaped_children_seconds() -> float:
    """CPU of this process's waited-for children (the load generator runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def postmaster_pid(data_directory: str) -> int | None:
    """The PostgreSQL server's main pid (its backends are its children), if readable."""
    try:
        return int((Path(data_directory) / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None

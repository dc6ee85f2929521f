"""CPU time and peak memory of the processes under test, read from ``/proc``.

Sampling ``/proc`` from the outside needs no cooperation from the measured process, costs it
nothing, and works the same for every crawler, Redis and the site. ``VmHWM`` is the kernel's
own high-water mark of the resident set, so a sample taken shortly before the process exits
already holds its peak; CPU samples are kept as a time series so that CPU can be attributed
to the crawl window (first to last page fetch) rather than to start-up and shutdown.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from dataclasses import dataclass, field

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class ProcSeries:
    """What was seen of one process: CPU samples and the last high-water mark."""

    pid: int
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    hwm_kb: int = 0

    def cpu_at(self, when: float) -> float:
        """CPU seconds used up to ``when``, interpolated between the two nearest samples."""
        if not self.times:
            return 0.0
        i = bisect_left(self.times, when)
        if i <= 0:
            return self.cpu[0]
        if i >= len(self.times):
            return self.cpu[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        c0, c1 = self.cpu[i - 1], self.cpu[i]
        return c0 + (c1 - c0) * (when - t0) / max(t1 - t0, 1e-9)

    def cpu_between(self, start: float, end: float) -> float:
        return max(self.cpu_at(end) - self.cpu_at(start), 0.0)


def read_cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            text = fh.read()
    except OSError:
        return None
    # the command name may contain spaces and parentheses: fields start after the last ')'
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def read_system_busy_seconds() -> float:
    """CPU seconds all CPUs spent busy since boot (everything but idle and iowait).

    The benchmark may share the machine with other work; the system total minus the
    processes under test says how much CPU that other work took during a crawl.
    """
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    guest = sum(fields[8:10])  # already counted in user and nice
    return (sum(fields) - idle - guest) / CLOCK_TICKS


def read_hwm_kb(pid: int) -> int | None:
    """Peak resident set size (VmHWM) of ``pid`` in KiB; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class ProcSampler:
    """Samples a fixed set of named processes; call :meth:`sample` from the wait loop."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.series = {name: ProcSeries(pid) for name, pid in pids.items()}
        self.system = ProcSeries(0)

    def sample(self, now: float) -> None:
        self.system.times.append(now)
        self.system.cpu.append(read_system_busy_seconds())
        for series in self.series.values():
            cpu = read_cpu_seconds(series.pid)
            hwm = read_hwm_kb(series.pid)
            if cpu is not None:
                series.times.append(now)
                series.cpu.append(cpu)
            if hwm is not None:
                series.hwm_kb = max(series.hwm_kb, hwm)

    def cpu_between(self, names: list[str], start: float, end: float) -> float:
        return sum(self.series[n].cpu_between(start, end) for n in names if n in self.series)

    def background_cores(self, start: float, end: float) -> float:
        """Average CPUs busy with anything but the sampled processes between two times."""
        ours = self.cpu_between(list(self.series), start, end)
        return max(self.system.cpu_between(start, end) - ours, 0.0) / max(end - start, 1e-9)

    def peak_mib(self, name: str) -> float:
        return self.series[name].hwm_kb / 1024 if name in self.series else 0.0

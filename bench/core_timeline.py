#!/usr/bin/env python3
"""core_timeline: who had the polled cores, from a scheduler trace.

A polling target and a polling client each want all of their core; on a shared machine a run's
IOPS say as much about the other threads on those cores as about the target. Record the switches
of a run and read them here:

    perf record -a -e sched:sched_switch -o sw.data -- sleep 5   # while the run goes
    perf script -i sw.data | bench/core_timeline.py TARGET_TID CLIENT_TID [BIN_SECONDS]

TARGET_TID is the target's reactor thread (reactor_0 under /proc/PID/task), CLIENT_TID the
client's (bdevperf's reactor_1). For each bin it prints how long each was on a CPU, in how many
slices, how long both were on a CPU at once (a polled request/response pair moves only then),
and the threads that held the target's CPU meanwhile.
"""
import collections
import re
import sys

PAT = re.compile(
    r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch:\s+prev_comm=(.*?) prev_pid=(\d+) prev_prio=\d+ "
    r"prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)"
)


def main():
    tgt, client = int(sys.argv[1]), int(sys.argv[2])
    width = float(sys.argv[3]) if len(sys.argv) > 3 else 0.25
    ev = []
    for line in sys.stdin:
        m = PAT.search(line)
        if m:
            ev.append((float(m.group(2)), int(m.group(1)), int(m.group(4)), m.group(5), m.group(6), int(m.group(7))))
    if not ev:
        sys.exit("no sched_switch events on stdin")
    ev.sort()
    t0, t1 = ev[0][0], ev[-1][0]
    on = {}  # cpu -> (tid, comm, since)
    runs = collections.defaultdict(list)  # tid -> [(start, end, cpu, comm)]
    out_states = collections.Counter()
    for t, cpu, prev, state, ncomm, nxt in ev:
        if cpu in on:
            tid, comm, since = on[cpu]
            runs[tid].append((since, t, cpu, comm))
            if tid == tgt:
                out_states[state] += 1
        on[cpu] = (nxt, ncomm, t)
    target_cpus = {cpu for _, _, cpu, _ in runs[tgt]}
    print(f"trace {t1 - t0:.2f} s; the target left its CPU {sum(out_states.values())} times, "
          f"by state {dict(out_states)} (R: preempted while runnable)")

    def clip(ivs, b0, b1):
        return [(max(s, b0), min(e, b1)) for s, e, *_ in ivs if min(e, b1) > max(s, b0)]

    b0 = t0
    while b0 < t1:
        b1 = b0 + width
        tt, cc = clip(runs[tgt], b0, b1), clip(runs[client], b0, b1)
        both = sum(max(0.0, min(e, e2) - max(s, s2)) for s, e in tt for s2, e2 in cc)
        others = collections.Counter()
        for tid, ivs in runs.items():
            if tid in (tgt, client):
                continue
            for s, e, cpu, comm in ivs:
                if cpu in target_cpus and min(e, b1) > max(s, b0):
                    others[f"{comm}/{tid}"] += min(e, b1) - max(s, b0)
        top = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in others.most_common(4))
        ton = sum(e - s for s, e in tt)
        print(f"{b0 - t0:6.2f}-{b1 - t0:5.2f} s  target {ton * 1e3:6.1f} ms ({len(tt):3} slices)  "
              f"client {sum(e - s for s, e in cc) * 1e3:6.1f} ms  both {both * 1e3:6.1f} ms  | "
              f"target's CPU held by (ms): {top}")
        b0 = b1


if __name__ == "__main__":
    main()

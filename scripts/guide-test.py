#!/usr/bin/env python3
"""Run the user guides (docs/guide/*.md) as tests: each guide's ```sh blocks, in order.

A guide is run as one bash script (so variables and background jobs carry from block to block)
under `set -eE -o pipefail`, in a fresh temporary folder, with `ferrite` on PATH. The first
command that fails stops the guide; the test prints the guide's file, line and text of it.

Fenced blocks:
  ```sh                     run by the test (and what a user types)
  ```sh whose first line is `# needs: REASON`
                            not run: the reason (root, a kernel module, a VM...) is shown to
                            the reader and printed by the test as a skip; with a second line
                            `# run if: SHELL-CONDITION` it is run where the condition holds
  any other info string     (text, json, console...) an example, never run

Guides run one at a time (each uses its own TCP ports as well, so it may run beside other
tests). Whatever a guide left running (its daemon, when a command failed before the guide's
tear-down) is killed afterwards: the guide runs in a process group of its own. A guide that
passes but leaves a process running fails. Its temporary folder is removed in all cases.

Usage: scripts/guide-test.py [GUIDE.md ...]   (default: every docs/guide/*.md but README.md)
Environment: FERRITE_BIN (default: the newer of target/release/ferrite and target/debug/ferrite),
GUIDE_TIMEOUT (seconds per guide, default 300), GUIDE_KEEP=1 keeps the temporary folders.
"""

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

print = functools.partial(print, flush=True)  # noqa: A001 (in order with the guides' output)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([^`\s]*)")


def blocks(path):
    """The fenced blocks of a markdown file: (info string, first line number, lines)."""
    out = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2), i + 1
        body = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            sys.exit(f"{path}:{start}: fenced block never closed")
        out.append((info, start + 1, body))
        i += 1
    return out


def script(path):
    """The bash script of a guide, and the reasons of the blocks it leaves out."""
    name = os.path.relpath(path, ROOT)
    # Script line -> guide line, so that a failure names the guide's line (even when it fails
    # inside a function the guide defined): the ERR trap writes the outermost line it ran.
    parts = [
        "set -eE -o pipefail",
        "__block=0; __reported=",
        "__fail() { local rc=$1 n=${#BASH_LINENO[@]}; [ -n \"$__reported\" ] && return; __reported=1;"
        " echo \"$__block ${BASH_LINENO[n-2]} $rc\" > .guide.failed; }",
        "trap '__fail $?' ERR",
    ]
    lines = {}
    skipped, n = [], 0
    for info, line, body in blocks(path):
        if info != "sh":
            continue
        n += 1
        first = body[0].strip() if body else ""
        second = body[1].strip() if len(body) > 1 else ""
        cond = None
        if first.startswith("# needs:"):
            why = first[len("# needs:"):].strip()
            if not second.startswith("# run if:"):
                skipped.append((n, line, why))
                continue
            cond = second[len("# run if:"):].strip()
        parts.append(f"__block={n}")
        if cond:
            # Only the condition is exempt from -e: the block's commands are checked as usual.
            parts.append(f"if {cond}; then")
        parts.append(f"echo '--- {name} block {n} (line {line})'")
        for k, text in enumerate(body):
            parts.append(text)
            lines[len(parts)] = line + k
        if cond:
            why_q = why.replace("'", "")
            parts.append(f"else echo 'SKIP {name} block {n} (line {line}): needs {why_q}'; fi")
    parts.append(f"echo '--- {name}: all blocks ran'")
    return "\n".join(parts) + "\n", n, skipped, lines


def failed_at(path, work, lines):
    """Prints the guide line whose command failed, from what the ERR trap left."""
    try:
        with open(os.path.join(work, ".guide.failed"), encoding="utf-8") as f:
            block, sline, rc = f.read().split()
    except (OSError, ValueError):
        return
    gline = lines.get(int(sline))
    if gline is None:
        print(f"     in block {block}, exit {rc}")
        return
    with open(path, encoding="utf-8") as f:
        text = f.read().split("\n")[gline - 1]
    print(f"     {os.path.relpath(path, ROOT)}:{gline} (block {block}) exit {rc}: {text.strip()}")


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def stop_group(pgid):
    """Ends every process of the group: TERM, then KILL after 5 s. True if any was left."""
    if not group_alive(pgid):
        return False
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.time() + 5
    while time.time() < deadline and group_alive(pgid):
        time.sleep(0.1)
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    return True


def run(path, bindir, timeout):
    """Runs one guide; True if it passed."""
    name = os.path.relpath(path, ROOT)
    text, count, skipped, lines = script(path)
    for n, line, why in skipped:
        print(f"SKIP {name} block {n} (line {line}): needs {why}")
    work = tempfile.mkdtemp(prefix="guide-")
    with open(os.path.join(work, ".guide.sh"), "w", encoding="utf-8") as f:
        f.write(text)
    env = dict(os.environ)
    env["PATH"] = bindir + os.pathsep + env["PATH"]
    env["HOME"] = work
    print(f"== {name}: {count} sh blocks, {len(skipped)} not run, in {work}", flush=True)
    proc = subprocess.Popen(["bash", ".guide.sh"], cwd=work, env=env, start_new_session=True)
    ok = True
    try:
        rc = proc.wait(timeout=timeout)
        if rc != 0:
            print(f"FAIL {name}: exit {rc}")
            failed_at(path, work, lines)
            ok = False
    except subprocess.TimeoutExpired:
        print(f"FAIL {name}: still running after {timeout} s")
        ok = False
    except BaseException:
        # Interrupted (Ctrl-C): take the guide's processes and folder down with the runner.
        stop_group(proc.pid)
        shutil.rmtree(work, ignore_errors=True)
        raise
    # The shell is gone (or about to be); anything left in its group was started by the guide.
    time.sleep(0.2)
    if stop_group(proc.pid) and ok:
        print(f"FAIL {name}: left processes running after its last block (killed now)")
        ok = False
    proc.wait()
    if os.environ.get("GUIDE_KEEP") == "1":
        print(f"   kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'ok' if ok else 'FAILED'}  {name}", flush=True)
    return ok


def main():
    # A runner that is stopped takes the running guide's processes down with it (see run()).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    binary = os.environ.get("FERRITE_BIN")
    if not binary:
        # The newer of the two builds, so that a stale release binary does not shadow a fresh one.
        found = [os.path.join(ROOT, c) for c in ("target/release/ferrite", "target/debug/ferrite")]
        found = [b for b in found if os.access(b, os.X_OK)]
        binary = max(found, key=os.path.getmtime) if found else None
    if not binary or not os.access(binary, os.X_OK):
        sys.exit("guide-test: no ferrite binary: build it or set FERRITE_BIN")
    binary = os.path.abspath(binary)
    guides = sys.argv[1:] or sorted(
        os.path.join(ROOT, "docs/guide", g)
        for g in os.listdir(os.path.join(ROOT, "docs/guide"))
        if g.endswith(".md") and g != "README.md"
    )
    bindir = tempfile.mkdtemp(prefix="guide-bin-")
    os.symlink(binary, os.path.join(bindir, "ferrite"))
    timeout = int(os.environ.get("GUIDE_TIMEOUT", "300"))
    print(f"guide-test: ferrite = {binary}")
    try:
        failed = [g for g in guides if not run(os.path.abspath(g), bindir, timeout)]
    finally:
        shutil.rmtree(bindir, ignore_errors=True)
    if failed:
        print("guide-test: failed: " + " ".join(os.path.relpath(g, ROOT) for g in failed))
        sys.exit(1)
    print(f"guide-test: all {len(guides)} guides passed")


if __name__ == "__main__":
    main()

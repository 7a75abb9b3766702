#!/usr/bin/env python3
"""Counts where a byte string lies in another process's writable memory, by kind of mapping, for
tests/gpu/ipc-probe.sh: does an importer's libcuda keep the exporter's IPC handle (or its pid) where a
checkpoint tool could read it from outside?

  ipc_scan.py PID HEX [HEX ...]      one line per pattern: `HEX heap=N anon=N stack=N other=N`

Reads /proc/PID/maps and /proc/PID/mem (root); mappings over 1 GiB are skipped. Standard library only.
"""

import sys

LIMIT = 1 << 30


def regions(pid):
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            parts = line.split()
            start, end = (int(x, 16) for x in parts[0].split("-"))
            perms = parts[1]
            path = parts[5] if len(parts) > 5 else ""
            if "r" not in perms or "w" not in perms or end - start > LIMIT:
                continue
            kind = "heap" if path == "[heap]" else "stack" if path.startswith("[stack") else "anon" if not path else "other"
            yield start, end, kind


def main(argv):
    if len(argv) < 3 or not argv[1].isdigit():
        print(__doc__.strip(), file=sys.stderr)
        return 2
    pid = int(argv[1])
    patterns = [bytes.fromhex(h) for h in argv[2:]]
    counts = [dict(heap=0, anon=0, stack=0, other=0) for _ in patterns]
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for start, end, kind in regions(pid):
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except OSError:
                continue
            for i, pattern in enumerate(patterns):
                counts[i][kind] += data.count(pattern)
    for h, c in zip(argv[2:], counts):
        print(h[:32], " ".join(f"{k}={v}" for k, v in c.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Prints why each failed ctest entry failed, from ctest's LastTest.log.

CI shows only the tail of a run's output, and ctest --output-on-failure
prints a failed test's whole log before the summary, so the assertion
that failed scrolls out of sight. This digest goes last: for every failed
entry, its GoogleTest failures (file:line, message, the [  FAILED  ]
lines) or, for a script test, the last lines it printed.

Usage: failure-digest.py BUILD_DIR/Testing/Temporary/LastTest.log
"""
import re
import sys

MAX_LINES_PER_TEST = 60


def entries(text):
    """Yields (name, output lines, passed) per test entry."""
    for block in re.split(r"\n-{58}\n\n", text):
        m = re.search(r'^\d+/\d+ Test: (\S+)', block, re.M)
        if not m:
            continue
        out = block.split("Output:\n" + "-" * 58 + "\n", 1)
        body = out[1].split("<end of output>", 1)[0] if len(out) == 2 else ""
        ok = "Test Passed." in block or "Skipped" in block
        yield m.group(1), body.splitlines(), ok


def digest(lines):
    picked = []
    for i, line in enumerate(lines):
        if re.search(r"(: Failure$|^\[  FAILED  \]|^\[ RUN      \])", line):
            picked.append(i)
            if line.endswith(": Failure"):
                picked.extend(range(i + 1, min(i + 8, len(lines))))
    if not any(": Failure" in lines[i] or "FAILED" in lines[i] for i in picked):
        return lines[-25:]  # a script test, a crash or a timeout: its end
    # Keep a [ RUN ] line only when its own failure follows it (an assertion
    # or its [  FAILED  ] line), not the run's closing summary.
    keep, run_at = [], None
    for i in sorted(set(picked)):
        line = lines[i]
        if line.startswith("[ RUN      ]"):
            run_at = i
            continue
        if run_at is not None:
            name = lines[run_at][12:].strip()
            if line.endswith(": Failure") or line.startswith(
                    f"[  FAILED  ] {name} ("):
                keep.append(run_at)
            run_at = None
        keep.append(i)
    return [lines[i] for i in keep]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        text = open(sys.argv[1], errors="replace").read()
    except OSError as e:
        sys.exit(f"failure-digest: {e}")
    failed = [(n, l) for n, l, ok in entries(text) if not ok]
    if not failed:
        return
    print(f"\n=== why {len(failed)} test(s) failed (from {sys.argv[1]}) ===")
    for name, lines in failed:
        print(f"--- {name}")
        shown = digest(lines)
        for line in shown[:MAX_LINES_PER_TEST]:
            print("  " + line[:300])
        if len(shown) > MAX_LINES_PER_TEST:
            print(f"  ... {len(shown) - MAX_LINES_PER_TEST} more lines")


if __name__ == "__main__":
    main()

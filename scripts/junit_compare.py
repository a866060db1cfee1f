"""Compare two pytest JUnit XML reports: the same test ids, the same outcome for each?

    python3 scripts/junit_compare.py plain.xml recorded.xml   -> one JSON object on stdout
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET


def outcomes(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[tid] = ("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds
                    else "passed")
    return out


def main() -> None:
    a, b = outcomes(sys.argv[1]), outcomes(sys.argv[2])
    count = {name: {k: sum(1 for v in d.values() if v == k) for k in ("passed", "failed", "skipped")}
             for name, d in (("plain", a), ("recorded", b))}
    print(json.dumps({
        "tests": {"plain": len(a), "recorded": len(b)}, "outcomes": count,
        "ids_only_plain": sorted(set(a) - set(b))[:20], "ids_only_recorded": sorted(set(b) - set(a))[:20],
        "outcome_differs": sorted(t for t in set(a) & set(b) if a[t] != b[t])[:20],
        "same": a == b,
    }))


if __name__ == "__main__":
    main()

"""Checks that every job's goodput partitions its wall time (docs/goodput.md): productive plus
every badput cause equals the wall time within 1% (0.05 s for short jobs), no figure is
negative and the ratio is at most 1. As a script: reads `meshrun --output=json list` on stdin
and exits 1 naming each job that does not add up."""
import json
import sys


def problems(jobs):
    """One line per job (manifests as JSON dicts, proto field names) whose goodput is wrong."""
    bad = []
    for job in jobs:
        g = job.get("goodput", {})
        wall = g.get("wall_seconds", 0.0)
        parts = {"productive": g.get("productive_seconds", 0.0), **g.get("badput_seconds", {})}
        total = sum(parts.values())
        negative = [k for k, v in parts.items() if v < 0]
        if abs(total - wall) > max(0.01 * wall, 0.05) or negative or g.get("ratio", 0) > 1:
            bad.append(f"{job['job_id']} ({job.get('state')}): wall {wall:.3f} s, "
                       f"sum {total:.3f} s, {parts}")
    return bad


if __name__ == "__main__":
    jobs = json.load(sys.stdin).get("jobs", [])
    bad = problems(jobs)
    if bad:
        print("FAIL: goodput does not add up:\n  " + "\n  ".join(bad))
        sys.exit(1)
    print(f"goodput adds up for all {len(jobs)} jobs")

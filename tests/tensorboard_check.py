"""Checks a `meshrun export --format=tensorboard` file with TensorBoard's own event reader.

Every (step, value) of every element must equal the job's history as `meshrun export
--format=jsonl` wrote it, and the tags must follow "series" / "series/i/j".
Usage: tensorboard_check.py <event file> <history.jsonl>
"""
import json
import math
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator


def element_tags(name, shape):
    if not shape:
        return [name]
    return [name + "/" + "/".join(str(i) for i in index) for index in np.ndindex(*shape)]


def main(event_file, jsonl):
    expected = {}  # tag -> [(step, value)]
    wall_times = {}
    with open(jsonl) as f:
        for line in f:
            row = json.loads(line)
            wall_times[row["step"]] = row["wall_time_unix_micros"] / 1e6
            for name, series in row["values"].items():
                for tag, value in zip(element_tags(name, series["shape"]), series["values"]):
                    expected.setdefault(tag, []).append(
                        (row["step"], math.nan if value is None else float(np.float32(value))))
    if not expected:
        sys.exit("the history is empty")

    acc = event_accumulator.EventAccumulator(event_file, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    missing = set(expected) - tags
    if missing:
        sys.exit(f"tags missing from the event file: {sorted(missing)[:5]}")
    for tag, points in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        if len(got) != len(points):
            sys.exit(f"{tag}: {len(got)} points in the event file, {len(points)} in history")
        for (step, value), (got_step, got_value) in zip(points, got):
            same = (math.isnan(value) and math.isnan(got_value)) or value == got_value
            if step != got_step or not same:
                sys.exit(f"{tag}: history has step {step} = {value}, event file {got_step} = {got_value}")
    for event in acc.Scalars(next(iter(expected))):
        if abs(event.wall_time - wall_times[event.step]) > 1e-3:
            sys.exit(f"step {event.step}: wall time {event.wall_time}, history {wall_times[event.step]}")
    points = sum(len(p) for p in expected.values())
    print(f"tensorboard reads {len(expected)} tags, {points} points, all equal to the history")


if __name__ == "__main__":
    main(*sys.argv[1:])

"""`meshrun --output=json` on every CLI command, against the real coordinator and worker: each
prints JSON objects, one a line, on stdout (export: JSON lines, its jsonl format), or refuses
with exit 2 naming the fix. The command list comes from the CLI itself, so a new command
without a case here fails."""
import json
import os
import re
import time

import pytest

from conftest import _bin
from test_sdk import export_convnet


def json_lines(result):
    lines = [l for l in result.stdout.splitlines() if l.strip()]
    assert lines, result
    return [json.loads(l) for l in lines]


def cli_commands(cluster):
    refused = cluster.cli("no-such-command")
    assert refused.returncode == 2
    return set(re.search(r"commands: (.*)", refused.stderr).group(1).split(", "))


def test_every_command_prints_json(tmp_path, cluster):
    bundle, ck = tmp_path / "bundle", tmp_path / "ck"
    ck.mkdir()
    export_convnet(str(bundle))
    js = lambda *args: cluster.cli("--output=json", *args)
    checked = {}

    def check(command, result, test, code=0):
        assert result.returncode == code, result
        objects = json_lines(result)
        assert test(objects), (command, objects)
        checked[command] = True
        return objects

    check("health", js("health", cluster.address), lambda o: o == [
        {"address": cluster.address, "status": "SERVING"}])
    down = js("--timeout=1s", "health", "127.0.0.1:1")
    check("health", down, lambda o: o[0]["status"] == "NOT_SERVING" and o[0]["code"], code=1)
    check("workers", js("workers"), lambda o: len(o[0]["workers"]) == 2)
    check("version", js("version"), lambda o: o[0]["version"] and o[0]["protocol_max"] >= 1)

    finished = check("submit", js("submit", str(bundle), "--steps=3", "--cadence=1", "--follow",
                                  "--wait=120s"),
                     lambda o: o[0]["state"] == "JOB_STATE_SUCCEEDED")[0]["job_id"]
    # The coordinator compiled it (CPU plugin): the cost analysis' FLOPs per step are known.
    check("get", js("get", finished), lambda o: o[0]["job_id"] == finished and
          float(o[0]["step_flops_per_device"]) > 0 and int(o[0]["device_bytes"]) > 0)
    check("list", js("list"), lambda o: finished in [j["job_id"] for j in o[0]["jobs"]])
    check("metrics", js("metrics"), lambda o: "worker-0" in [h["host"] for h in o[0]["hosts"]])
    check("memory", js("memory", "worker-0"), lambda o: len(o[0]["devices"]) >= 1)
    # The last summaries may reach the history just after the job's end.
    deadline = time.monotonic() + 20
    while len(js("export", finished).stdout.splitlines()) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    check("export", js("export", finished),
          lambda o: [s["step"] for s in o] == [1, 2, 3] and "loss" in o[0]["values"])
    check("watch", js("watch", finished), lambda o: [int(s["step"]) for s in o] == [1, 2, 3]
          and all(s["tflops_per_device"] > 0 and "mfu" not in s for s in o))
    conflict = js("export", finished, "--format=csv")
    assert conflict.returncode == 2 and "--format=jsonl" in conflict.stderr, conflict

    # A running job with a checkpoint policy: checkpoint it now, then cancel it.
    running = check("submit", js("submit", str(bundle), "--steps=1000000", "--cadence=5",
                                 f"--checkpoint_dir={ck}", "--checkpoint_every=1000000"),
                    lambda o: o[0]["job_id"])[0]["job_id"]
    deadline = time.monotonic() + 90
    while json_lines(js("get", running))[0]["state"] != "JOB_STATE_RUNNING":
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.2)
    check("checkpoint", js("checkpoint", running), lambda o: len(o) == 1 and
          o[0]["checkpoint_requested"] == running and o[0]["step"].isdigit())
    check("cancel", js("cancel", running), lambda o: o == [{"cancelled": running}])

    # compile: for a v6e slice through libtpu, no cluster (skipped where set-up fetched none).
    libtpu = os.path.join(os.path.dirname(_bin("meshrun")), "..", "..", ".deps", "libtpu",
                          "0.0.30", "libtpu.so")
    if os.path.exists(libtpu):
        check("compile", js("compile", str(bundle), "--target=v6e-8",
                            f"--compiler_plugin={libtpu}"),
              lambda o: o[0]["fits"] and o[0]["devices"] == 8 and
              [p["program"] for p in o[0]["programs"]] == ["init", "step"] and
              all(p["device_bytes"] > 0 and p["flops_per_device"] > 0 for p in o[0]["programs"]))
    else:
        checked["compile"] = True

    ca = tmp_path / "ca"
    check("certs", js("certs", "init", f"--dir={ca}", "--cluster=test"),
          lambda o: o[0]["cluster"] == "test" and o[0]["ca_dir"] == str(ca))
    check("certs", js("certs", "issue", f"--dir={ca}", "--role=worker", "--name=w1"),
          lambda o: o[0]["issued"] == "spiffe://test/worker/w1")
    token = js("certs", "token", "--role=view", "--name=alice")
    check("certs", token, lambda o: len(o[0]["token"]) > 20
          and o[0]["tokens_file_line"].endswith(" view alice"))
    assert token.stderr == "", token  # nothing a JSON consumer would miss

    # Drain: a worker of its own (the session's two serve the other tests) leaves for good.
    drained = cluster._start(
        [_bin("meshrun-worker"), "--listen=127.0.0.1:0", f"--coordinator={cluster.address}",
         "--host=drain-me", f"--state_dir={tmp_path}/drain-me", "--cpu_devices=1"],
        str(tmp_path / "drain-me.log"))
    deadline = time.monotonic() + 60
    while "drain-me" not in js("workers").stdout:
        assert time.monotonic() < deadline, (tmp_path / "drain-me.log").read_text()
        time.sleep(0.2)
    check("drain", js("drain", "drain-me"), lambda o: o == [{"draining": "drain-me"}])
    process = next(p for p in cluster.procs if p.pid == drained)
    assert process.wait(timeout=60) == 0, (tmp_path / "drain-me.log").read_text()

    assert set(checked) == cli_commands(cluster) | {"certs"}, set(checked) ^ cli_commands(cluster)


def test_bad_output_is_a_usage_error(cluster):
    result = cluster.cli("--output=yaml", "list")
    assert result.returncode == 2 and "--output=yaml is not text, json or textproto" in \
        result.stderr, result

"""The CLI explains itself (issue 28): every command's help exits 0 with its own usage, and
every command reads $MESHRUN_COORDINATOR, health included."""
import os
import re
import subprocess

import pytest

from conftest import _bin


def run(*args, env=None):
    if not os.path.exists(_bin("meshrun")):
        pytest.skip("MESHRUN_BIN_DIR does not hold the meshrun binaries")
    return subprocess.run([_bin("meshrun"), *args], capture_output=True, text=True, timeout=60,
                          env=env)


def commands():
    refused = run("no-such-command")
    assert refused.returncode == 2, refused
    return re.search(r"commands: (.*)", refused.stderr).group(1).split(", ")


def test_global_help_lists_every_command_and_exits_0():
    for args in (["--help"], ["help"], ["-h"]):
        result = run(*args)
        assert result.returncode == 0, result
        for command in commands():
            assert re.search(rf"^  {command}\b", result.stdout, re.M), (command, result.stdout)
        assert "exit codes:" in result.stdout and "MESHRUN_COORDINATOR" in result.stdout


@pytest.mark.parametrize("form", ["help <c>", "<c> --help", "--flags <c> --help"])
def test_each_command_prints_its_own_usage(form):
    for command in commands():
        args = {"help <c>": ["help", command], "<c> --help": [command, "--help"],
                "--flags <c> --help": ["--timeout", "3s", command, "-h"]}[form]
        result = run(*args)
        assert result.returncode == 0, (args, result)
        assert result.stdout.startswith(f"usage: meshrun [flags] {command}"), (args, result.stdout)
    submit = run("help", "submit").stdout
    for flag in ("--steps=100", "--data", "--follow", "--on_nonfinite=fail", "--resume_from"):
        assert flag in submit, submit
    unknown = run("help", "nope")
    assert unknown.returncode == 2 and "unknown command \"nope\"" in unknown.stderr, unknown


def test_health_reads_meshrun_coordinator(cluster):
    result = run("health", env=dict(os.environ, MESHRUN_COORDINATOR=cluster.address))
    assert result.returncode == 0 and result.stdout.strip() == "SERVING", result
    down = run("--timeout=2s", "health", env=dict(os.environ, MESHRUN_COORDINATOR="127.0.0.1:1"))
    assert down.returncode == 1 and "NOT SERVING" in down.stdout, down


def test_submit_follow_ends_with_the_summary_get_prints(tmp_path, cluster):
    lm = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "examples", "transformer_lm", "dp1")
    result = cluster.cli("submit", lm, "--steps=3", "--cadence=1", "--follow", "--wait=120s")
    assert result.returncode == 0, result
    job = result.stdout.split()[0]
    assert result.stdout.endswith(cluster.cli("get", job).stdout), result.stdout
    assert "state:       SUCCEEDED" in result.stdout and len(result.stdout.splitlines()) < 40

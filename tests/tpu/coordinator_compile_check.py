"""A coordinator on a CPU-only node compiles a TPU job for the slice its workers form
(--tpu_compiler_plugin) and ships the serialized executable, as it would to real v6e hosts.

The TPU host is a stand-in served over real gRPC (fake_tpu_host.py). Checks: the manifest says
the coordinator compiled for v6e-8 with the bytes per device and the FLOPs per step; the host
received each program's executable byte for byte (sha256 = the manifest's fingerprint); a model
too large for a v6e chip fails at launch naming the program and its bytes.
Usage: coordinator_compile_check.py <bin dir> <source dir>"""
import json
import os
import subprocess
import sys
import tempfile
import time

from fake_tpu_host import serve_v6e8_host, sha256_of


def start_coordinator(bin_dir, tmp, libtpu):
    """A coordinator with --tpu_compiler_plugin; returns (process, address)."""
    log = open(os.path.join(tmp, "coordinator.log"), "w+")
    process = subprocess.Popen(
        [os.path.join(bin_dir, "meshrun-coordinator"), "--listen=127.0.0.1:0",
         f"--state_dir={tmp}/coordinator", f"--tpu_compiler_plugin={libtpu}",
         "--heartbeat_timeout=60s"], stdout=log, stderr=subprocess.STDOUT)
    text = ""
    for _ in range(200):
        log.seek(0)
        text = log.read()
        if "listening on port" in text:
            return process, "127.0.0.1:" + text.split("listening on port ")[1].split()[0]
        time.sleep(0.05)
    process.kill()
    raise AssertionError(text)


def main(bin_dir, src):
    libtpu = os.path.join(src, ".deps", "libtpu", "0.0.30", "libtpu.so")
    if not os.path.exists(libtpu):
        print(f"SKIP: {libtpu} missing (scripts/fetch_libtpu.sh)")
        return 77
    tmp = tempfile.mkdtemp()
    coordinator, address = start_coordinator(bin_dir, tmp, libtpu)
    stop_host = None
    try:
        host, stop_host = serve_v6e8_host(address, "tpu-host-0", sha256_of(libtpu))

        def cli(*args):
            return subprocess.run([os.path.join(bin_dir, "meshrun"), f"--coordinator={address}",
                                   *args], capture_output=True, text=True, timeout=300)

        def wait_job(job, states):
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                m = json.loads(cli("--output=json", "get", job).stdout)
                if m["state"] in states:
                    return m
                time.sleep(0.2)
            raise AssertionError(f"job {job} not in {states}: {m}")

        submitted = cli("submit", os.path.join(src, "examples", "mlp_classifier", "dp8"),
                        "--steps=10")
        assert submitted.returncode == 0, submitted
        job = submitted.stdout.strip()
        m = wait_job(job, {"JOB_STATE_RUNNING", "JOB_STATE_FAILED"})
        assert m["state"] == "JOB_STATE_RUNNING", m
        assert m["compile_target"] == "v6e-8" and m["compiled_on"] == "coordinator for v6e-8", m
        assert float(m["step_flops_per_device"]) > 0 and int(m["device_bytes"]) > 0, m
        for role, fingerprint in m["program_fingerprints"].items():
            assert host.received.get(fingerprint) == fingerprint, (role, host.received)
        assert host.started == [job], host.started
        print(f"{job}: compiled on the coordinator for {m['compile_target']}: "
              f"{int(m['device_bytes'])} bytes per device, "
              f"{float(m['step_flops_per_device']):.4g} FLOPs per step per device, "
              f"{len(host.received)} executables shipped and verified")
        assert cli("cancel", job).returncode == 0
        wait_job(job, {"JOB_STATE_CANCELLED"})

        big = os.path.join(tmp, "too_large")
        subprocess.run([sys.executable, os.path.join(src, "tests", "tpu", "too_large_bundle.py"),
                        big, os.path.join(src, "examples")], check=True)
        submitted = cli("submit", big, "--steps=10")
        assert submitted.returncode == 0, submitted
        failed = wait_job(submitted.stdout.strip(), {"JOB_STATE_FAILED", "JOB_STATE_RUNNING"})
        assert failed["state"] == "JOB_STATE_FAILED", failed
        assert "program init needs 32.00 GiB per device" in failed["error"] and \
            "a v6e chip has 32.00 GiB" in failed["error"], failed["error"]
        print(f"too large: {failed['error']}")
        print("PASS")
        return 0
    finally:
        if stop_host is not None:
            stop_host()
        coordinator.terminate()
        coordinator.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

"""meshrun.export(..., target=) and meshrun.tpu.check_fit from Python: the MLP example bundle
fits v6e-8 with the same bytes per device and FLOPs `meshrun compile` reports, and the too-large
bundle raises DoesNotFitError naming the program. Usage: export_target_check.py <bin dir>
<source dir> (libtpu from .deps/libtpu/0.0.30)."""
import json
import os
import subprocess
import sys
import tempfile


def main(bin_dir, src):
    libtpu = os.path.join(src, ".deps", "libtpu", "0.0.30", "libtpu.so")
    if not os.path.exists(libtpu):
        print(f"SKIP: {libtpu} missing (scripts/fetch_libtpu.sh)")
        return 77
    os.environ["TPU_LIBRARY_PATH"] = libtpu
    from meshrun.errors import DoesNotFitError
    from meshrun.tpu import check_fit

    bundle = os.path.join(src, "examples", "mlp_classifier", "dp8")
    ours = check_fit(bundle, "v6e-8")["programs"]
    cli = json.loads(subprocess.run(
        [os.path.join(bin_dir, "meshrun"), "--output=json", "compile", bundle, "--target=v6e-8",
         f"--compiler_plugin={libtpu}"], capture_output=True, text=True, check=True).stdout)
    for program in cli["programs"]:
        role = program["program"]
        assert ours[role]["device_bytes"] == program["device_bytes"], (role, ours, program)
        assert ours[role]["flops_per_device"] == program["flops_per_device"], (role, ours, program)
    print(f"check_fit agrees with meshrun compile: {ours}")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(src, "tests", "tpu", "too_large_bundle.py"),
                        tmp, os.path.join(src, "examples")], check=True)
        try:
            check_fit(tmp, "v6e-8")
        except DoesNotFitError as e:
            assert "program init needs 32.00 GiB per device; a v6e chip has 32.00 GiB" in str(e), e
            print(f"refused: {e}")
        else:
            raise AssertionError("the 32 GiB model fit v6e-8")
    try:
        check_fit(bundle, "v6e-12")
    except ValueError as e:
        assert "v6e-12" in str(e) and "v6e-8" in str(e), e
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

"""Builds the meshrun package; the gRPC stubs (meshrun.v1.*_pb2*) are generated from the protos
at build time, never committed. The protos: $MESHRUN_PROTO_DIR, else proto/ beside this file (an
sdist, scripts/build_sdk.sh), else the repository's ../proto (a checkout)."""
import glob
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _proto_root():
    if os.environ.get("MESHRUN_PROTO_DIR"):
        return os.environ["MESHRUN_PROTO_DIR"]
    for root in (os.path.join(HERE, "proto"), os.path.join(HERE, "..", "proto")):
        if glob.glob(os.path.join(root, "meshrun", "v1", "*.proto")):
            return root
    raise RuntimeError(f"no meshrun/v1/*.proto under {HERE}/proto or {HERE}/../proto: build from "
                       "a meshrun checkout or an sdist made by scripts/build_sdk.sh, or set "
                       "MESHRUN_PROTO_DIR to the directory that holds meshrun/v1/*.proto")


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        import grpc_tools
        from grpc_tools import protoc

        root = _proto_root()
        protos = sorted(glob.glob(os.path.join(root, "meshrun", "v1", "*.proto")))
        if not protos:
            raise RuntimeError(f"no meshrun/v1/*.proto under {root} (MESHRUN_PROTO_DIR)")
        out = self.build_lib
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        args = ["protoc", f"-I{root}", f"-I{well_known}", f"--python_out={out}",
                f"--grpc_python_out={out}", *protos]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed on " + " ".join(protos))
        open(os.path.join(out, "meshrun", "v1", "__init__.py"), "a").close()


setup(cmdclass={"build_py": BuildPyWithStubs})

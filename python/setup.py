"""Builds the meshrun package; the gRPC stubs (meshrun.v1.*_pb2*) are generated from the
repository's proto/ directory at build time (MESHRUN_PROTO_DIR overrides), never committed."""
import glob
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.environ.get("MESHRUN_PROTO_DIR", os.path.join(HERE, "..", "proto"))


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        import grpc_tools
        from grpc_tools import protoc

        protos = sorted(glob.glob(os.path.join(PROTO_ROOT, "meshrun", "v1", "*.proto")))
        if not protos:
            raise RuntimeError(f"no meshrun/v1/*.proto under {PROTO_ROOT} (set MESHRUN_PROTO_DIR)")
        out = self.build_lib
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={out}",
                f"--grpc_python_out={out}", *protos]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed on " + " ".join(protos))
        open(os.path.join(out, "meshrun", "v1", "__init__.py"), "a").close()


setup(cmdclass={"build_py": BuildPyWithStubs})

"""The layout's rules (docs/layout.md), checked on the source tree: which folder's code may
include which, no include circle between folders, testing/ used by tests and benches only, no
Python module of the SDK importing one that imports it, and the size bounds (no product file
over 600 lines, no product folder over a quarter of the product's lines).

The build enforces the C++ rules per target through the CMake dependencies
(cmake/check_layering.cmake); this test holds the rules themselves, so a dependency added to a
CMakeLists.txt that breaks one still fails here. Usage: layering_test.py <source dir>."""
import ast
import os
import re
import sys

# Each product folder and the folders it may include (its own always). Subfolders belong to
# their top folder (worker/sparse is worker). `proto` is the generated meshrun/v1/*.pb.h.
BELOW_WORKER = {"bundle", "checkpoint", "telemetry", "runtime", "common", "proto"}
MAY_INCLUDE = {
    "common": set(),                                                   # rule 1
    "runtime": {"common"},                                             # rule 2
    "bundle": {"runtime", "common", "proto"},                          # rule 3
    "checkpoint": {"runtime", "common", "proto"},
    "telemetry": {"runtime", "common", "proto"},
    "worker": BELOW_WORKER,                                            # rule 4
    "jobspec": BELOW_WORKER | {"worker"},                              # rule 5
    "coordinator": {"jobspec", "telemetry", "checkpoint", "runtime",   # rule 6
                    "common", "proto"},
    "rpc": {"common", "proto", "runtime"},                             # rule 7
    "coordinator_service": {"rpc", "coordinator", "jobspec", "telemetry", "checkpoint",
                            "bundle", "runtime", "common", "proto"},   # rule 8
    "worker_service": {"rpc", "worker", "jobspec", "bundle", "telemetry", "checkpoint",
                       "runtime", "common", "proto"},                  # rule 9
    "cli": {"rpc", "bundle", "jobspec", "telemetry", "checkpoint",     # rule 10
            "runtime", "common", "proto"},
    "testing": None,  # rule 11: anything; only tests and benches include it
}
# Folders whose code is not a product: they may include anything, testing/ included.
TEST_FOLDERS = {"tests", "bench", "fuzz", "testing"}
MAX_FILE_LINES = 600
MAX_FOLDER_SHARE = 0.25
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of_header(header):
    top = header.split("/", 1)[0]
    if top == "meshrun":
        return "proto"
    return top if top in MAY_INCLUDE else None


def cpp_files(root):
    for folder in list(MAY_INCLUDE) + sorted(TEST_FOLDERS - {"testing"}):
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in names:
                if name.endswith((".cc", ".h")):
                    path = os.path.join(dirpath, name)
                    yield folder, os.path.relpath(path, root)


def is_test(folder, path):
    return folder in TEST_FOLDERS or path.endswith(("_test.cc", "_test.h"))


def check_includes(root):
    errors, edges = [], {}
    for folder, path in cpp_files(root):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            headers = INCLUDE.findall(f.read())
        for header in headers:
            target = folder_of_header(header)
            if target is None or target == folder:
                continue
            if target == "testing" and not is_test(folder, path):
                errors.append(f"{path}: includes {header}; testing/ is for tests and benches "
                              "only (rule 11)")
                continue
            if is_test(folder, path):
                continue
            allowed = MAY_INCLUDE[folder]
            if allowed is not None and target not in allowed:
                errors.append(f"{path}: includes {header}, but {folder}/ may include only "
                              f"{', '.join(sorted(allowed)) or 'nothing of meshrun'}")
            edges.setdefault(folder, set()).add(target)
    errors += [f"include circle between folders: {' -> '.join(c)}" for c in cycles(edges)]
    return errors


def cycles(edges):
    """Every elementary circle found by depth-first search (each reported once, as found)."""
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return found


def check_python_imports(root):
    """Rule 12: the import graph of the SDK's modules, lazy imports inside functions included,
    has no circle."""
    package = os.path.join(root, "python", "meshrun")
    edges = {}
    for name in sorted(os.listdir(package)):
        if not name.endswith(".py"):
            continue
        module = "meshrun" if name == "__init__.py" else "meshrun." + name[:-3]
        with open(os.path.join(package, name), encoding="utf-8") as f:
            tree = ast.parse(f.read(), name)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                names = ["meshrun." + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for imported in names:
                if imported.startswith("meshrun.") and not imported.startswith("meshrun.v1"):
                    edges.setdefault(module, set()).add(imported)
    return [f"Python import circle: {' -> '.join(c)} (rule 12)" for c in cycles(edges)]


def check_sizes(root):
    errors, lines = [], {}
    for folder, path in cpp_files(root):
        if is_test(folder, path):
            continue
        with open(os.path.join(root, path), encoding="utf-8") as f:
            n = sum(1 for _ in f)
        lines[folder] = lines.get(folder, 0) + n
        if n > MAX_FILE_LINES:
            errors.append(f"{path}: {n} lines; a product file over {MAX_FILE_LINES} usually "
                          "holds two jobs: split it by responsibility")
    total = sum(lines.values())
    for folder, n in sorted(lines.items()):
        if n > MAX_FOLDER_SHARE * total:
            errors.append(f"{folder}/: {n} of the product's {total} lines (over "
                          f"{MAX_FOLDER_SHARE:.0%}): split it into folders with one job each")
    return errors


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    errors = check_includes(root) + check_python_imports(root) + check_sizes(root)
    for e in errors:
        print("layering:", e)
    if errors:
        print(f"layering: {len(errors)} problem(s); the rules are in docs/layout.md")
        return 1
    print("layering: every folder keeps to its rules")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The command line the example scripts share: write the examples, or (--check) regenerate them
into a temporary directory and compare every file with the committed one, the numbers of
reference.json within a relative tolerance (XLA's CPU code follows the host's vector units)."""
import argparse
import filecmp
import json
import os
import tempfile


def same_numbers(a, b, rtol):
    """Whether two JSON values are equal, floats within rtol."""
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and abs(a - b) <= rtol * max(abs(a), abs(b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_numbers(a[k], b[k], rtol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_numbers(x, y, rtol) for x, y in zip(a, b))
    return a == b


def outputs_of(root, subdirs):
    found = set()
    for sub in subdirs:
        for dirpath, _, files in os.walk(os.path.join(root, sub)):
            found.update(os.path.relpath(os.path.join(dirpath, f), root) for f in files)
    return found


def same_output(fresh, committed, rtol):
    if os.path.basename(fresh) == "reference.json":
        with open(fresh) as f, open(committed) as g:
            return same_numbers(json.load(f), json.load(g), rtol)
    return filecmp.cmp(fresh, committed, shallow=False)


def check(export_all, subdirs, root, rtol):
    """Regenerates into a temporary directory and prints each file that differs; 1 if any."""
    with tempfile.TemporaryDirectory() as tmp:
        export_all(tmp, quiet=True)
        fresh, committed = outputs_of(tmp, subdirs), outputs_of(root, subdirs)
        problems = [f"missing in examples/: {p}" for p in sorted(fresh - committed)]
        problems += [f"not produced by the script: {p}" for p in sorted(committed - fresh)]
        problems += [f"differs: {p}" for p in sorted(fresh & committed)
                     if not same_output(os.path.join(tmp, p), os.path.join(root, p), rtol)]
    for p in problems:
        print(p)
    print(f"{len(fresh)} files regenerated, {len(problems)} problems")
    return 1 if problems else 0


def main(doc, export_all, subdirs, root, rtol):
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temporary directory and compare with examples/")
    parser.add_argument("--out", default=root, help="output root (default: examples/)")
    args = parser.parse_args()
    if args.check:
        return check(export_all, subdirs, root, rtol)
    export_all(args.out)
    return 0

#!/usr/bin/env python3
"""Turns real text into meshrun token shard files (format: docs/data.md).

Default corpus: the fortune cookie files of Debian's `fortunes` / `fortunes-min` packages
(/usr/share/games/fortunes), where a line holding only `%` separates two fortunes. Each fortune
is one document. Tokens are bytes (vocabulary 256); token 0 is BOS and starts every document
(the script refuses text that contains a 0 byte). Documents are packed back to back, so every
document begins at a BOS token; shards end on document boundaries.

Deterministic: files are read in sorted name order and shards are rewritten only when their
bytes change, so running it again is cheap and leaves the files untouched. Shard files of an
earlier run that are no longer produced are removed.

    .venv/bin/python examples/make_token_shards.py [--source DIR_OR_FILE] [--out DIR]
"""

import argparse
import hashlib
import os
import struct
import sys

import numpy as np

MAGIC = b"MRTOKSHD"
VERSION = 1
VOCAB_SIZE = 256
BOS = 0
HEADER = struct.Struct("<8sIIIIQQQ")  # magic, version, vocab, bos, reserved, tokens, docs, first doc
PREFIX = "shard-"
SUFFIX = ".tok"


def source_files(source):
    """The text files of `source` in sorted order: fortune files, not their .dat indexes."""
    if os.path.isfile(source):
        return [source]
    names = []
    for name in sorted(os.listdir(source)):
        path = os.path.join(source, name)
        # .u8 entries are symlinks to the same files; .dat files are strfile indexes.
        if os.path.islink(path) or not os.path.isfile(path) or name.endswith(".dat"):
            continue
        names.append(path)
    return names


def documents(path):
    """The fortunes of one file, as bytes, in file order; blank ones are skipped."""
    with open(path, "rb") as f:
        text = f.read()
    if bytes([BOS]) in text:
        sys.exit(f"{path}: contains byte {BOS}, which is the BOS token; pick another corpus")
    doc = []
    for line in text.split(b"\n"):
        if line.rstrip(b"\r") == b"%":
            if b"".join(doc).strip():
                yield b"\n".join(doc) + b"\n"
            doc = []
        else:
            doc.append(line)
    if b"".join(doc).strip():
        yield b"\n".join(doc).rstrip(b"\n") + b"\n"


def shard_bytes(docs, first_document):
    tokens = []
    starts = []
    for doc in docs:
        starts.append(sum(len(t) for t in tokens))
        tokens.append(bytes([BOS]) + doc)
    stream = np.frombuffer(b"".join(tokens), dtype=np.uint8).astype("<u2")
    header = HEADER.pack(MAGIC, VERSION, VOCAB_SIZE, BOS, 0, stream.size, len(docs),
                         first_document)
    return header + stream.tobytes() + np.asarray(starts, dtype="<u8").tobytes()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="/usr/share/games/fortunes")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", ".data",
                                                      "fortunes"))
    parser.add_argument("--shard_tokens", type=int, default=1 << 18,
                        help="a shard ends at the first document boundary past this many tokens")
    args = parser.parse_args()

    files = source_files(args.source)
    if not files:
        sys.exit(f"{args.source}: no text files (install the Debian package `fortunes`)")
    shards, current, size = [], [], 0
    for path in files:
        for doc in documents(path):
            current.append(doc)
            size += len(doc) + 1
            if size >= args.shard_tokens:
                shards.append(current)
                current, size = [], 0
    if current:
        shards.append(current)

    os.makedirs(args.out, exist_ok=True)
    wanted, first, total_tokens = set(), 0, 0
    for i, docs in enumerate(shards):
        name = f"{PREFIX}{i:05d}{SUFFIX}"
        wanted.add(name)
        data = shard_bytes(docs, first)
        first += len(docs)
        total_tokens += sum(len(d) + 1 for d in docs)
        path = os.path.join(args.out, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                if f.read() == data:
                    continue
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
    for name in os.listdir(args.out):
        if name.startswith(PREFIX) and name.endswith(SUFFIX) and name not in wanted:
            os.remove(os.path.join(args.out, name))
    digest = hashlib.sha256()
    for name in sorted(wanted):
        with open(os.path.join(args.out, name), "rb") as f:
            digest.update(f.read())
    print(f"token shards: {len(shards)} files, {total_tokens} tokens, {first} documents "
          f"in {os.path.normpath(args.out)} (sha256 {digest.hexdigest()[:16]})")


if __name__ == "__main__":
    main()

"""The revision of a model's files (ModelInfo.revision; docs/receipts.md), computed as the
gateway's internal/receipt.DirRevision does: "sha256:<hex>" of the lines
"<sha256 hex of the file>  <path relative to the folder>\\n" of every regular file under the
folder (links followed, names starting with "." skipped), sorted by path; a file that links
to a blob named by its SHA-256 (the Hugging Face cache's weights) is not read."""

from __future__ import annotations

import hashlib
import os
import re

_SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")


def _file_sha256(path: str) -> str:
    if os.path.islink(path):
        base = os.path.basename(os.readlink(path))
        if _SHA256_NAME.match(base):
            return base
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dir_revision(folder: str) -> str:
    files = []
    for root, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for n in names:
            if n.startswith("."):
                continue
            p = os.path.join(root, n)
            if os.path.isfile(p):  # follows links
                files.append(os.path.relpath(p, folder).replace(os.sep, "/"))
    files.sort(key=lambda s: s.encode())
    h = hashlib.sha256()
    for rel in files:
        h.update(f"{_file_sha256(os.path.join(folder, rel))}  {rel}\n".encode())
    return "sha256:" + h.hexdigest()

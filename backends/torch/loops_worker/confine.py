"""What the folders and URLs of a request may name (the Go worker's backends/serve/confine.go).

A folder must be an absolute path without "..", inside one of the worker's --allow-dir
folders once symbolic links are resolved (those of its existing part; what does not exist
yet has none), and the entries it already holds must not link outside them (the engine
reads and writes them). A URL must have the scheme, host and port of one of the
--checkpoint-origin values (the checkpoint store's), and a redirect may lead nowhere else.
Every request is checked before the engine sees it. A link put in place between the check
and the engine's use is not caught, so an allowed folder must be writable only by the user
the gateway and the worker run as (the gateway's data dir is).
"""

from __future__ import annotations

import os
import urllib.parse

from .errors import invalid

MAX_PATH_BYTES = 4096


def _origin(u: urllib.parse.SplitResult) -> tuple[str, str, int]:
    try:
        port = u.port
    except ValueError:
        port = -1
    if port is None:
        port = 443 if u.scheme == "https" else 80
    return (u.scheme, (u.hostname or "").lower(), port)


def parse_origin(s: str) -> tuple[str, str, int]:
    """scheme://host[:port] -> (scheme, host, port); ValueError for anything else."""
    u = urllib.parse.urlsplit(s)
    o = _origin(u)
    if u.scheme not in ("http", "https") or not u.hostname or u.username is not None or u.password is not None \
            or u.path not in ("", "/") or u.query or u.fragment or o[2] < 0:
        raise ValueError(f"--checkpoint-origin {s!r} must be scheme://host[:port] of the checkpoint store (e.g. https://s3.example.com)")
    return o


class Confinement:
    """The allowed folders (resolved) and checkpoint store origins of a worker."""

    def __init__(self, dirs=(), origins=()):
        self.roots = []
        for d in dirs:
            if not os.path.isabs(d):
                raise ValueError(f"--allow-dir {d!r} must be an absolute path")
            r = os.path.realpath(d)
            if not os.path.isdir(r):
                raise ValueError(f"--allow-dir {d} is not a folder")
            self.roots.append(r)
        self.origins = [parse_origin(o) for o in origins]

    def _inside(self, real: str) -> bool:
        return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in self.roots)

    def dir(self, field: str, p: str) -> None:
        """Checks a folder a request names ("" is none)."""
        if not p:
            return
        if len(p.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES or "\x00" in p:
            raise invalid(f"{field} is not a usable path")
        if not os.path.isabs(p):
            raise invalid(f"{field} must be an absolute path")
        if ".." in p.replace(os.sep, "/").split("/"):
            raise invalid(f"{field} must not contain '..'")
        if not self.roots:
            raise invalid(f"{field} names a folder, but this worker reads and writes none: start it with --allow-dir FOLDER "
                          "(a folder it shares with the gateway), or have the gateway send checkpoints as URLs")
        real = os.path.realpath(p)
        if not self._inside(real):
            raise invalid(f"{field} is outside the folders this worker may use (its --allow-dir folders)")
        try:
            entries = list(os.scandir(real))
        except OSError:
            return  # not there yet (a save creates it), or not a folder: the engine says so
        for e in entries:
            if e.is_symlink() and not self._inside(os.path.realpath(e.path)):
                raise invalid(f"{field} holds a symbolic link that leads outside the folders this worker may use")

    def url(self, field: str, raw: str) -> None:
        """Checks a URL a request names ("" is left to the engine)."""
        if not raw:
            return
        if not self.origins:
            raise invalid(f"{field}: this worker takes no checkpoint URLs: start it with --checkpoint-origin, "
                          "the checkpoint store's scheme://host[:port]")
        try:
            u = urllib.parse.urlsplit(raw)
        except ValueError:
            raise invalid(f"{field} holds a URL that is not http(s)://host/...") from None
        if u.scheme not in ("http", "https") or not u.hostname or u.username is not None or u.password is not None:
            raise invalid(f"{field} holds a URL that is not http(s)://host/...")
        o = _origin(u)
        if o not in self.origins:
            raise invalid(f"{field} holds a URL of {o[0]}://{o[1]}:{o[2]}, which is not this worker's checkpoint store")

    def files(self, field: str, files) -> None:
        for f in files:
            self.url(field, f.url)

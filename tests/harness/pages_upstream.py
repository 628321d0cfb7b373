"""hopmeter's demo upstream, serving the browser tests' own pages too, as a process of its own.

    python -m tests.harness.pages_upstream PORT

Everything the demo upstream serves (its chat page at /demo/, the streams), plus the files of
tests/integration/browser_pages/ at /pages/NAME (the truth page, the AI SDK page and its bundle,
built by scripts/build-test-clients). Every request's method and path is printed, one line each
("seen POST /v1/chat/completions"), so a test can tell what reached the upstream and what did
not (a beacon must never).
"""

from __future__ import annotations

import asyncio
import mimetypes
import sys
from pathlib import Path

from hopmeter.upstream.server import Request, UpstreamServer, _plain

PAGES = Path(__file__).resolve().parents[1] / "integration" / "browser_pages"


class PagesUpstream(UpstreamServer):
    """The demo upstream with /pages/* and a line per request."""

    async def _respond(self, req: Request, w: asyncio.StreamWriter) -> bool:
        print(f"seen {req.method} {req.path}", flush=True)
        if req.method == "GET" and req.path.startswith("/pages/"):
            f = (PAGES / req.path.removeprefix("/pages/")).resolve()
            if PAGES not in f.parents or not f.is_file():
                await _plain(w, 404, b"no such page\n")
                return True
            ctype = mimetypes.guess_type(f.name)[0] or "application/octet-stream"
            await _plain(w, 200, f.read_bytes(), f"{ctype}; charset=utf-8")
            return True
        return await super()._respond(req, w)


async def main(port: int) -> None:
    """Serve on 127.0.0.1:`port` until killed."""
    server = PagesUpstream()
    await server.start("127.0.0.1", port)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))

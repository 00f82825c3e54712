"""The Python examples of docs/connectors.md and clients/python/README.md run
as they are written: each ```python block, in order, against a real kvtier
(``127.0.0.1:6379`` in the text is pointed at a test server, ``:6380`` at the
TLS port of another), in a directory holding scripts/test-certs.sh's
certificates, so their relative paths resolve."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import ROOT, Server

DOCS = [ROOT / "docs" / "connectors.md", ROOT / "clients" / "python" / "README.md"]


def blocks(path: Path) -> list[tuple[int, str]]:
    """The ```python blocks of a Markdown file, with their first line's number."""
    text = path.read_text()
    found = []
    for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M):
        found.append((text.count("\n", 0, m.start()) + 2, m.group(1)))
    return found


EXAMPLES = [(path, line, code) for path in DOCS for line, code in blocks(path)]


def test_the_docs_have_examples() -> None:
    assert len(blocks(DOCS[0])) >= 3 and len(blocks(DOCS[1])) >= 1


@pytest.mark.parametrize(
    "path,line,code", EXAMPLES, ids=["%s:%d" % (p.name, line) for p, line, _ in EXAMPLES]
)
def test_example_runs_as_written(
    path: Path, line: int, code: str, server: Server, tls_kvtier: tuple[Server, str], certs: Path
) -> None:
    tls_server, tls_url = tls_kvtier
    server.client().execute("FLUSHALL")
    tls_server.client().execute("FLUSHALL")
    tls_port = tls_url.split("://")[1].split("?")[0]
    pointed = code.replace("127.0.0.1:6379", server.addr).replace("127.0.0.1:6380", tls_port)
    assert pointed != code, "%s:%d names no server" % (path.name, line)
    cwd = os.getcwd()
    os.chdir(certs)
    try:
        exec(compile(pointed, "%s:%d" % (path, line), "exec"), {"__name__": "__doc_example__"})
    finally:
        os.chdir(cwd)

"""The Python examples of docs/connectors.md and clients/python/README.md run
as they are written, twice in a row, in a fresh venv holding only what those
pages' ``pip install`` lines install: each ```python block against a real
kvtier (``127.0.0.1:6379`` in the text is pointed at a test server,
``:6380`` at the TLS port of another), in a directory holding
scripts/test-certs.sh's certificates, so their relative paths resolve."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, Server

DOCS = [ROOT / "docs" / "connectors.md", ROOT / "clients" / "python" / "README.md"]


def blocks(path: Path, lang: str = "python") -> list[tuple[int, str]]:
    """The ```lang blocks of a Markdown file, with their first line's number."""
    text = path.read_text()
    found = []
    for m in re.finditer(r"^```%s\n(.*?)^```$" % lang, text, re.S | re.M):
        found.append((text.count("\n", 0, m.start()) + 2, m.group(1)))
    return found


def pip_lines() -> list[str]:
    """The ``pip install ...`` lines of the pages' ```sh blocks, comments cut."""
    lines = []
    for path in DOCS:
        for _, code in blocks(path, "sh"):
            for line in code.splitlines():
                if line.startswith("pip install "):
                    lines.append(" ".join(shlex.split(line, comments=True)))
    return lines


EXAMPLES = [(path, line, code) for path in DOCS for line, code in blocks(path)]


def test_the_docs_have_examples() -> None:
    assert len(blocks(DOCS[0])) >= 3 and len(blocks(DOCS[1])) >= 1
    assert "pip install ./clients/python" in pip_lines()


@pytest.fixture(scope="session")
def docs_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh venv into which only the docs' ``pip install``
    lines were run (from the repository's root, as the docs say)."""
    venv = tmp_path_factory.mktemp("docs-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    for line in pip_lines():
        subprocess.run(
            [str(python), "-m", *shlex.split(line), "-q", "--disable-pip-version-check"],
            cwd=ROOT,
            check=True,
            timeout=600,
        )
    return python


@pytest.mark.parametrize(
    "path,line,code", EXAMPLES, ids=["%s:%d" % (p.name, line) for p, line, _ in EXAMPLES]
)
def test_example_runs_twice_as_written(
    path: Path,
    line: int,
    code: str,
    server: Server,
    tls_kvtier: tuple[Server, str],
    certs: Path,
    docs_python: Path,
) -> None:
    tls_server, tls_url = tls_kvtier
    server.client().execute("FLUSHALL")
    tls_server.client().execute("FLUSHALL")
    tls_port = tls_url.split("://")[1].split("?")[0]
    pointed = code.replace("127.0.0.1:6379", server.addr).replace("127.0.0.1:6380", tls_port)
    assert pointed != code, "%s:%d names no server" % (path.name, line)
    for run in (1, 2):
        out = subprocess.run(
            [str(docs_python), "-c", pointed], cwd=certs, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, "%s:%d, run %d:\n%s" % (path, line, run, out.stderr)

"""The install (docs/design.md#the-outbox-service): ``pip install atmostonce`` has what the core, the SQLite store and the HTTP transport need
and nothing more; PostgreSQL, Synapse and the conformance suite come with extras; ``.[test]`` has them all.

The dependency lists are read from pyproject.toml; the claim that the core needs nothing else is checked by running
the core imports and the README's front-door snippet in a fresh interpreter in which every extra's module refuses
to import."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]

# distributions that must never come with the core install, and the import names of everything an extra brings
NOT_IN_CORE = {
    *("pytest", "pytest-xdist", "hypothesis", "mutmut", "matrix-synapse", "testcontainers", "ruff", "psycopg"),
    *("starlette", "uvicorn", "jinja2", "itsdangerous", "selenium", "opentelemetry-sdk"),
}
EXTRA_MODULES = (
    *("pytest", "hypothesis", "mutmut", "synapse", "twisted", "signedjson", "testcontainers", "psycopg"),
    *("starlette", "uvicorn", "jinja2", "itsdangerous", "selenium", "opentelemetry"),
)
# the start of a script run in a fresh interpreter: importing any extra's module fails, as in a core install
NO_EXTRAS = textwrap.dedent(
    f"""
    import importlib.abc, sys

    class NoExtras(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {EXTRA_MODULES!r}:
                raise ImportError("not in the core install: " + name)
            return None

    sys.meta_path.insert(0, NoExtras())
    """
)


def names(reqs: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in reqs}


def test_the_core_install_pulls_no_test_framework_synapse_mutmut_or_postgres_driver():
    assert names(PROJECT["dependencies"]) & NOT_IN_CORE == set()


def test_each_extra_has_what_it_is_for_and_test_has_them_all():
    extras = PROJECT["optional-dependencies"]
    assert {"psycopg", "psycopg-pool"} <= names(extras["postgres"])
    assert "matrix-synapse" in names(extras["matrix"])
    assert {"pytest", "hypothesis"} <= names(extras["conformance"])
    assert {"starlette", "jinja2", "itsdangerous", "python-multipart", "uvicorn"} <= names(extras["console"])
    assert "opentelemetry-api" in names(extras["otel"])
    assert any(r.replace(" ", "") == "atmostonce[postgres,matrix,conformance,console,otel]" for r in extras["test"])
    assert {"pytest-xdist", "ruff", "testcontainers", "mutmut", "selenium", "opentelemetry-sdk"} <= names(
        extras["test"]
    )


def test_the_core_imports_and_the_front_door_run_without_any_extra(tmp_path):
    blocks = re.findall(r"^```python\n(.*?)^```$", (ROOT / "README.md").read_text("utf-8"), flags=re.S | re.M)
    script = NO_EXTRAS + textwrap.dedent(
        f"""
        import atmostonce, atmostonce_cli.main, atmostonce_cli.demo, atmostonce_http, atmostonce_sql
        import atmostonce.runtime, atmostonce.service, atmostonce.audit, atmostonce.signing
        atmostonce_cli.main.build_parser()  # the settle and console commands parse without the console extra
        exec(compile({blocks[0]!r}, "README.md", "exec"))
        outbox.close()
        sink.stop()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "published"


def test_a_postgresql_url_without_the_postgres_extra_names_the_extra(tmp_path):
    script = textwrap.dedent(
        """
        import importlib.abc, sys

        class NoDriver(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "psycopg":
                    raise ModuleNotFoundError("No module named " + repr(name), name=name)
                return None

        sys.meta_path.insert(0, NoDriver())
        import atmostonce
        try:
            atmostonce.open_store("postgresql://nobody@127.0.0.1:1/none")
        except ModuleNotFoundError as exc:
            print(exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "pip install 'atmostonce[postgres]'" in done.stdout, done.stdout + done.stderr


def test_the_async_front_door_runs_on_sqlite_with_the_core_install_alone(tmp_path):
    script = NO_EXTRAS + textwrap.dedent(
        """
        import asyncio
        import atmostonce
        from atmostonce.transport import Capabilities, Found, NotFound, Sent

        class Echo:
            name, protocol_version = "echo", 1
            capabilities = Capabilities(read_back=True, lookup_by_key=True)
            def __init__(self):
                self.objects = {}
            async def send(self, request):
                rid = "obj-" + str(len(self.objects))
                self.objects[rid] = dict(request.body)
                return Sent(rid)
            async def read_back(self, remote_id):
                return Found(remote_id, self.objects[remote_id])
            async def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
                return NotFound()
            def matches(self, request, found):
                return dict(found.body or {}) == dict(request.body)
            async def aclose(self):
                pass

        async def main():
            async with atmostonce.open_async("sqlite:///outbox.sqlite3", transport=Echo()) as outbox:
                it = await outbox.submit("acct", "post", "room", {"text": "hi"})
                await outbox.run(until_idle=True, timeout=60)
                print(type(outbox.async_store).__name__, (await outbox.get(it.key)).state)

        asyncio.run(main())
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["AsyncSqlStore", "published"]

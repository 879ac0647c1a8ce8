"""Pin the case bundle (``spec/conformance/bundle.json``): ``python -m tests.conformance.bundle [VERSION]``
records the digest of the case files as they are now, and the version when one is given.
``tests/conformance/test_python_route.py`` fails while the pinned digest is not the files' own."""

from __future__ import annotations

import json
import sys

from atmostonce.conformance.cases import BUNDLE_FILE, bundle_digest, cases_dir

PATH = cases_dir() / BUNDLE_FILE


def pin(version: str | None = None) -> dict:
    doc = json.loads(PATH.read_text("utf-8"))
    doc["digest"] = bundle_digest()
    if version:
        doc["version"] = version
    PATH.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", "utf-8")
    return doc


if __name__ == "__main__":
    print(pin(sys.argv[1] if len(sys.argv) > 1 else None))

"""Runs ``gcp-storage-emulator`` in memory, with GCS's object generation semantics.

Usage: ``python tests/_gcs_server.py PORT`` (serves on 127.0.0.1 until killed).

The emulator (2026.7.19) stores a ``generation`` per object but ignores the
generation preconditions of the GCS JSON API and sends no ``x-goog-generation``
header with object data. tensorstore (Orbax's array store) needs both for its
OCDBT manifests: it revalidates a cached manifest with ``ifGenerationNotMatch``
and reads the generation of a 200 answer from that header. Against the bare
emulator the answer has generation 0, and tensorstore's next conditional
request fails with "Malformed StorageGeneration" (seen when a resumed run
saves its first checkpoint). This launcher adds what GCS does:

- ``ifGenerationMatch`` / ``ifGenerationNotMatch`` on object reads (412 / 304)
  and ``ifGenerationMatch`` on media uploads (412; 0 means "must not exist");
- ``x-goog-generation`` and ``x-goog-metageneration`` on object data.

Storage faults for tests: while the JSON file named by the environment
variable ``CALIB_JAX_GCS_FAULTS`` exists, holding ``{"bucket": B, "prefix": P,
"after": N, "status": S}``, media uploads to ``B`` of objects whose name
starts with ``P`` get the HTTP status ``S`` (403: refused, not retried by
clients) once ``N`` of them have succeeded; with ``"stall_s": T`` instead of
a status, the next one is answered (normally) only after ``T`` seconds or
once the rule is removed (the test's ``heal``), whichever comes first,
during which the server, which serves one request at a time, answers
nothing else.
"""

from __future__ import annotations

import json
import os
import sys
import time
from http import HTTPStatus

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download, _get, _insert = objects.download, objects.get, objects.insert


def _arg(request, name: str) -> str | None:
    values = request.query.get(name)
    return values[0] if values else None


def _generation(storage, bucket: str, name: str) -> str | None:
    try:
        return str(storage.get_file_obj(bucket, name)["generation"])
    except NotFound:
        return None


def _read_allowed(request, response, storage) -> bool:
    """Applies the read preconditions; False when the answer is already set."""
    match, not_match = (
        _arg(request, "ifGenerationMatch"),
        _arg(request, "ifGenerationNotMatch"),
    )
    if match is None and not_match is None:
        return True
    current = _generation(
        storage, request.params["bucket_name"], request.params["object_id"]
    )
    if current is None:
        return True  # the handler answers 404
    if match is not None and match != current:
        response.status = HTTPStatus.PRECONDITION_FAILED
        return False
    if not_match is not None and not_match == current:
        response.status = HTTPStatus.NOT_MODIFIED
        return False
    return True


def download(request, response, storage, *args, **kwargs):
    if not _read_allowed(request, response, storage):
        return
    _download(request, response, storage, *args, **kwargs)
    if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
        obj = storage.get_file_obj(
            request.params["bucket_name"], request.params["object_id"]
        )
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj["metageneration"])


def get(request, response, storage, *args, **kwargs):
    if _arg(request, "alt") == "media":
        return download(request, response, storage, *args, **kwargs)
    if not _read_allowed(request, response, storage):
        return
    return _get(request, response, storage, *args, **kwargs)


_UPLOADS = {}  # media uploads that matched a fault rule, per (bucket, prefix)


def _fault(bucket: str, name: str | None) -> int | None:
    """The status a fault rule gives this upload, or None."""
    path = os.environ.get("CALIB_JAX_GCS_FAULTS")
    if not path or name is None or not os.path.exists(path):
        return None
    with open(path) as f:
        rule = json.load(f)
    if bucket != rule["bucket"] or not name.startswith(rule["prefix"]):
        return None
    key = (bucket, rule["prefix"])
    done = _UPLOADS.get(key, 0)
    _UPLOADS[key] = done + 1
    if done < rule["after"]:
        return None
    if "stall_s" in rule:
        if done == rule["after"]:  # one upload hangs; the others pass
            end = time.monotonic() + rule["stall_s"]
            while os.path.exists(path) and time.monotonic() < end:
                time.sleep(0.05)
        return None
    return int(rule["status"])


def insert(request, response, storage, *args, **kwargs):
    match, name = _arg(request, "ifGenerationMatch"), _arg(request, "name")
    media = _arg(request, "uploadType") == "media"
    status = _fault(request.params["bucket_name"], name) if media else None
    if status is not None:
        request.data  # consume the body before answering  # noqa: B018
        response.status = HTTPStatus(status)
        return None
    if (
        match is not None
        and name is not None
        and _arg(request, "uploadType") == "media"
    ):
        current = _generation(storage, request.params["bucket_name"], name)
        if (current or "0") != match:
            request.data  # consume the body before answering  # noqa: B018
            response.status = HTTPStatus.PRECONDITION_FAILED
            return None
    return _insert(request, response, storage, *args, **kwargs)


def _install() -> None:
    objects.download, objects.get, objects.insert = download, get, insert
    swap = {_download: download, _get: get, _insert: insert}
    for _, handlers in server.HANDLERS:
        for method, handler in handlers.items():
            handlers[method] = swap.get(handler, handler)


if __name__ == "__main__":
    _install()
    server.create_server("127.0.0.1", int(sys.argv[1]), in_memory=True).run()

"""A Google Cloud Storage API emulator on 127.0.0.1 for tests of ``gs://`` paths.

``gcp-storage-emulator`` serves the GCS JSON API in memory (started by
``_gcs_server.py``, which adds the object-generation semantics tensorstore
relies on); the clients are pointed at it through their emulator settings:

- gcsfs (``etils.epath``'s ``gs://`` backend): ``STORAGE_EMULATOR_HOST``;
  ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` keeps gcsfs from asking the
  Storage Control gRPC API (which the emulator does not serve) for the bucket
  layout; it would fall back to the same JSON API after a warning;
- tensorstore (Orbax's array store): ``TENSORSTORE_GCS_HTTP_URL`` and
  ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` (any token; the emulator checks none);
- google-cloud-storage (Orbax's bucket metadata lookups): ``STORAGE_EMULATOR_HOST``.

The helpers here talk to the emulator over plain HTTP (no gcsfs), so tests
inspect the bucket without the listing caches of the code under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from _processes import free_port  # noqa: F401 - also this module's API

# Hang guards, not expectations: a start takes about a second and a request
# milliseconds on a quiet machine; a loaded one may take ten times that.
START_TIMEOUT = 300.0
HTTP_TIMEOUT = 120.0
_SERVER = Path(__file__).with_name("_gcs_server.py")


class Emulator:
    """A running emulator; :meth:`stop` ends it."""

    def __init__(self, log_dir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log_dir) / "gcs_emulator.log"
        self.faults = Path(log_dir) / "faults.json"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(_SERVER), str(self.port)],
                cwd=log_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, CALIB_JAX_GCS_FAULTS=str(self.faults)),
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self._get("b?project=test")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"the GCS emulator did not answer on {self.url}: "
                        + self.log.read_text()[-2000:]
                    ) from None
                time.sleep(0.05)

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point every client at this emulator."""
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }

    def _get(self, path: str, *, raw: bool = False):
        url = f"{self.url}/storage/v1/{path}"
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as r:
            data = r.read()
        return data if raw else json.loads(data)

    def create_bucket(self, name: str) -> None:
        """Creates an empty bucket ``name``."""
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as r:
            r.read()

    def buckets(self) -> list[str]:
        """Names of every bucket."""
        return [b["name"] for b in self._get("b?project=test").get("items", [])]

    def objects(self, bucket: str, prefix: str = "") -> list[str]:
        """Names of every object under ``prefix`` (all pages)."""
        names, token = [], None
        while True:
            query = {"prefix": prefix, "maxResults": 1000}
            if token:
                query["pageToken"] = token
            page = self._get(f"b/{bucket}/o?{urllib.parse.urlencode(query)}")
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken")
            if not token:
                return sorted(names)

    def read(self, bucket: str, name: str) -> bytes:
        """The content of one object."""
        quoted = urllib.parse.quote(name, safe="")
        return self._get(f"b/{bucket}/o/{quoted}?alt=media", raw=True)

    def delete(self, bucket: str, name: str) -> None:
        """Deletes one object."""
        quoted = urllib.parse.quote(name, safe="")
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b/{bucket}/o/{quoted}", method="DELETE"
        )
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as r:
            r.read()

    def fail_uploads(self, prefix: str, *, after: int, status: int = 403) -> None:
        """Refuses uploads under ``bucket/prefix`` with ``status`` after ``after`` more.

        ``prefix`` is ``"<bucket>/<object name prefix>"``; only the uploads
        that match count.
        """
        bucket, name = prefix.split("/", 1)
        rule = {"bucket": bucket, "prefix": name, "after": after, "status": status}
        self.faults.write_text(json.dumps(rule))

    def stall_uploads(self, prefix: str, *, after: int, seconds: float) -> None:
        """After ``after`` uploads under ``bucket/prefix``, the next hangs.

        It hangs ``seconds`` at most, or until :meth:`heal`. The server answers
        one request at a time: while it hangs, every client of the emulator
        waits. Later uploads pass.
        """
        bucket, name = prefix.split("/", 1)
        rule = {"bucket": bucket, "prefix": name, "after": after, "stall_s": seconds}
        self.faults.write_text(json.dumps(rule))

    def heal(self) -> None:
        """Ends the fault of :meth:`fail_uploads` or :meth:`stall_uploads`."""
        self.faults.unlink(missing_ok=True)

    def stop(self) -> None:
        """Ends the emulator (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

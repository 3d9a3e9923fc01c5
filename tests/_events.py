"""Reads TensorBoard event files back: TFRecord framing plus tensorboardX's protos.

Independent of calib_jax's writer: every record's length and payload CRC-32C
(masked, as TFRecord specifies) are checked, so a truncated or corrupt file
fails the test instead of losing values silently.
"""

from __future__ import annotations

import glob
import os
import struct

import numpy as np
from tensorboardX.crc32c import crc32c
from tensorboardX.proto import event_pb2


def _masked(data: bytes) -> int:
    x = crc32c(data) & 0xFFFFFFFF
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path: str) -> list[bytes]:
    """The payloads of a TFRecord file, each CRC-checked."""
    with open(path, "rb") as f:
        return parse_records(f.read(), path)


def parse_records(data: bytes, path: str = "<bytes>") -> list[bytes]:
    """The payloads of TFRecord-framed ``data``, each CRC-checked."""
    out, i = [], 0
    while i < len(data):
        header = data[i : i + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[i + 8 : i + 12])
        assert hcrc == _masked(header), f"bad length CRC at byte {i} of {path}"
        payload = data[i + 12 : i + 12 + length]
        (pcrc,) = struct.unpack("<I", data[i + 12 + length : i + 16 + length])
        assert len(payload) == length and pcrc == _masked(payload), path
        out.append(payload)
        i += 16 + length
    return out


def event_files(logdir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))


def read_events(logdir: str):
    """``(scalars, images)``: ``{(tag, step): float32}`` and ``{(tag, step): (h, w, png)}``."""
    return events_of([read_records(p) for p in event_files(logdir)])


def events_of(files: list[list[bytes]]):
    """:func:`read_events` of the records of event files, oldest file first.

    A file that starts a resumed run (a ``SessionLog.START`` event at step
    ``T``, tensorboardX's ``purge_step``) drops the earlier files' values at
    steps ``>= T``, as TensorBoard does. A value written twice for one tag
    and step without such a purge fails.
    """
    scalars, images = {}, {}
    for records in files:
        for record in records:
            event = event_pb2.Event.FromString(record)
            if event.HasField("session_log") and event.session_log.status == 1:
                purge = int(event.step)
                for d in (scalars, images):
                    for key in [k for k in d if k[1] >= purge]:
                        del d[key]
            for v in event.summary.value:
                key = (v.tag, int(event.step))
                # Written again only after a purge of its step.
                assert key not in scalars and key not in images, f"{key} twice"
                if v.HasField("simple_value"):
                    scalars[key] = np.float32(v.simple_value)
                elif v.HasField("image"):
                    img = v.image
                    images[key] = (img.height, img.width, img.encoded_image_string)
    return scalars, images

"""Schemathesis hooks for the media types the API uses beyond JSON (scripts/api-fuzz.sh
loads this module with SCHEMATHESIS_HOOKS).

- Request bodies of `application/x-tar` (PUT .../archive): generated as real tar archives
  of small files with generated names and contents, so an unpack is exercised rather than
  refused as malformed (what a tar holds cannot be said in JSON Schema).
- Bodies of `PUT .../secrets/{name}`: the hosts are moved under `fuzz.test`, the one
  destination api-fuzz.sh's org allows, so a schema-valid secret is stored instead of
  refused by the org's egress allowlist (a policy no schema can state). Hosts that are
  not a list of strings are left as generated, for the negative cases.
- Responses of `application/x-ndjson` (a streamed exec, a process's output): every line
  must be one JSON object of a known frame type; the last line is handed to the schema
  check (StreamFrame).
"""

import io
import json
import tarfile

import schemathesis
from hypothesis import strategies as st

NAMES = st.from_regex(r"\A[a-z0-9_-]{1,16}\Z")


def _tar(files):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


TARS = st.lists(st.tuples(NAMES, st.binary(max_size=2048)), min_size=1, max_size=4, unique_by=lambda f: f[0]).map(
    _tar
)

schemathesis.openapi.media_type("application/x-tar", TARS)

@schemathesis.hook
def map_body(ctx, body):
    if isinstance(body, dict) and "value" in body and isinstance(body.get("hosts"), list):
        hosts = body["hosts"]
        if all(isinstance(h, str) for h in hosts):
            body["hosts"] = [f"h{i}.fuzz.test" + (":443" if i % 2 else "") for i in range(len(hosts))]
    return body


FRAME_TYPES = {"stdout", "stderr", "exit", "error"}


@schemathesis.deserializer("application/x-ndjson")
def ndjson(ctx, response):
    lines = response.content.decode("utf-8").splitlines()
    if not lines:
        raise ValueError("an NDJSON response with no line")
    frames = []
    for number, line in enumerate(lines, 1):
        frame = json.loads(line)
        if not isinstance(frame, dict) or frame.get("type") not in FRAME_TYPES:
            raise ValueError(f"line {number} is not a frame: {line!r}")
        frames.append(frame)
    return frames[-1]

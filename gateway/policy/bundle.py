"""An OPA bundle (gzipped tarball) of exactly what the embedded engine loads.

The bundle holds every policy module under its path relative to the policy
directory, the merged data documents as one `data.json`, and a `.manifest`
whose `revision` is the same content hash the embedded engine reports, so both
engines name a policy the same way in the audit log. No `roots` are declared:
the bundle owns all of `data`, as the policy directory does for the embedded
engine. The archive is reproducible (fixed order, times and owners), so an
unchanged directory always yields the same bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

from gateway.policy.sources import PolicySources

BUNDLE_NAME = "execgate"


def _add(tar: tarfile.TarFile, name: str, content: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    info.mode = 0o644
    info.mtime = 0
    tar.addfile(info, io.BytesIO(content))


def build_bundle(sources: PolicySources) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        manifest = {"revision": sources.revision, "metadata": {"source": str(sources.root)}}
        _add(tar, "/.manifest", json.dumps(manifest).encode())
        for name in sorted(sources.modules):
            rel = Path(name).relative_to(sources.root).as_posix()
            _add(tar, f"/{rel}", sources.modules[name].encode("utf-8"))
        if sources.data:
            _add(tar, "/data.json", json.dumps(sources.data, sort_keys=True).encode())
    return gzip.compress(raw.getvalue(), mtime=0)

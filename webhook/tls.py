"""A server TLS context whose certificate can be rotated under a running server.

Each rotation builds a fresh `SSLContext` from the files and swaps it in; the listening context's
`sni_callback` (called for every handshake, SNI sent or not) hands each new connection the current one.
Reloading into the live context instead would be unsafe: `load_cert_chain` can install the new
certificate and then fail on a key that does not match yet, leaving a broken context. Here a failed
load keeps the old certificate and is retried on the next check. Open connections keep their session.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

from cryptography import x509

log = logging.getLogger(__name__)


def server_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class ReloadingTls:
    """Owns the listening context; `check()` reloads when the cert or key file changed (inode or mtime)."""

    def __init__(
        self,
        cert_file: str | Path,
        key_file: str | Path,
        *,
        on_reload: Callable[[bool], None] | None = None,
    ) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self._on_reload = on_reload or (lambda ok: None)
        self._stamp = self._file_stamps()
        self._current = server_context(self.cert_file, self.key_file)
        self.not_after = self._read_not_after()
        self.reloads = 0
        self.listening = server_context(self.cert_file, self.key_file)
        self.listening.sni_callback = self._pick
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _pick(self, sslobj: ssl.SSLObject, _server_name: str | None, _ctx: ssl.SSLContext) -> None:
        sslobj.context = self._current

    def _file_stamps(self) -> tuple[int, ...]:
        # The inode too: an atomic rename within one timestamp tick (coarse-grained filesystems) still
        # shows as a change.
        cert, key = os.stat(self.cert_file), os.stat(self.key_file)
        return (cert.st_ino, cert.st_mtime_ns, key.st_ino, key.st_mtime_ns)

    def _read_not_after(self) -> float:
        cert = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
        return cert.not_valid_after_utc.timestamp()

    def check(self) -> bool:
        """Reload if the files changed; True when a new certificate was installed."""
        try:
            stamp = self._file_stamps()
        except OSError as exc:
            log.warning("cannot stat certificate files: %s", exc)
            return False
        if stamp == self._stamp:
            return False
        try:
            fresh = server_context(self.cert_file, self.key_file)
            not_after = self._read_not_after()
        except (OSError, ssl.SSLError, ValueError) as exc:
            # Typically the cert was replaced before its key: keep serving the old pair, retry later.
            log.warning("certificate reload failed, keeping the previous one: %s", exc)
            self._on_reload(False)
            return False
        try:
            settled = self._file_stamps() == stamp
        except OSError:
            settled = False
        if not settled:
            # A file was replaced while we read them (cert, then key, mid-rotation): what was loaded may
            # belong to neither stamp, and recording the older one would reload the same pair again next
            # tick. Install nothing; the next check reads the files once they have settled.
            return False
        self._current, self._stamp, self.not_after = fresh, stamp, not_after
        self.reloads += 1
        log.info("reloaded TLS certificate from %s (expires %s)", self.cert_file, not_after)
        self._on_reload(True)
        return True

    def start(self, interval_s: float) -> None:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                self.check()

        self._thread = threading.Thread(target=loop, name="tls-reload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

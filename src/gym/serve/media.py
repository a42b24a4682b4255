"""Where a request's images may come from: the server's rules for `image_url`, which a remote client must not be
able to bend into reading the server's files or making it fetch without limits.

    data:image/...;base64,...   always (bounded by the request body limit, --max_body_bytes)
    file:///path                only with --media-dir DIR, and only for a file inside DIR once symlinks and `..`
                                are resolved; anything else is refused before the file is looked at, so a client
                                learns nothing about files outside DIR
    http:// and https://        only with --allow-remote-media, each fetch at most `max_bytes` and `timeout`
                                seconds in all (a server that drips bytes is cut off too)

Every refusal is a MediaError naming the request field (`messages.0.content.1.image_url`), which the HTTP door
answers with a 400. What comes back is bytes (or the data URL itself) for gym.data.media.load_image, which checks
that it is an image of a sane size before any pixel is decoded.
"""

from __future__ import annotations

import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gym.data.media import MediaError

DEFAULT_MAX_MEDIA_BYTES = 16 << 20  # a 16 MiB image file is already far beyond what a vision processor keeps
DEFAULT_REMOTE_TIMEOUT = 10.0
_SCHEMES = ("a data: URL (data:image/png;base64,...), a file:// URL under --media-dir, or an http(s) URL with "
            "--allow-remote-media")


@dataclass(frozen=True)
class MediaPolicy:
    """`media_dir`: the folder file:// URLs may read (None: none); `allow_remote`: whether http(s) URLs are
    fetched; `max_bytes` and `timeout`: the limits of one file read or fetch."""

    media_dir: Path | None = None
    allow_remote: bool = False
    max_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    timeout: float = DEFAULT_REMOTE_TIMEOUT

    def __post_init__(self) -> None:
        if self.media_dir is not None:  # compared with resolved paths, so it is resolved itself (symlinks too)
            object.__setattr__(self, "media_dir", Path(self.media_dir).expanduser().resolve())

    def fetch(self, url: str, where: str) -> bytes | str:
        """The image's bytes (or the data URL itself), if the rules allow reading it; MediaError otherwise."""
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "data":
            return url
        if scheme == "file":
            return self._read_file(url, where)
        if scheme in ("http", "https"):
            return self._download(url, where)
        raise MediaError(where, f"{_show(url)} is not an image URL this server reads; give {_SCHEMES}.")

    def _read_file(self, url: str, where: str) -> bytes:
        if self.media_dir is None:
            raise MediaError(where, "file:// URLs are off on this server (a client must not read the server's "
                                    "files); start gym api with --media-dir DIR to serve images from DIR, or send "
                                    "a data: URL.")
        parts = urllib.parse.urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise MediaError(where, f"{_show(url)}: a file:// URL names a file on this machine (file:///path).")
        # resolve() follows every symlink and removes `..`; the check is on where the path really leads.
        path = Path(urllib.request.url2pathname(parts.path)).resolve()
        if not path.is_relative_to(self.media_dir):
            raise MediaError(where, f"{_show(url)} is outside the folder this server reads images from "
                                    "(--media-dir); give a file inside it, or send a data: URL.")
        if not path.is_file():
            raise MediaError(where, f"no such image file under --media-dir: {_show(url)}.")
        try:
            with path.open("rb") as handle:
                data = handle.read(self.max_bytes + 1)
        except OSError as exc:
            raise MediaError(where, f"{_show(url)} cannot be read ({exc.strerror or exc}).") from None
        if len(data) > self.max_bytes:
            raise MediaError(where, f"{_show(url)} is over the image size limit of {self.max_bytes:,} bytes.")
        return data

    def _download(self, url: str, where: str) -> bytes:
        if not self.allow_remote:
            raise MediaError(where, "image URLs on the web are not fetched by this server; start gym api with "
                                    "--allow-remote-media to allow it, or send the image as a data: URL.")
        import httpx

        deadline = time.monotonic() + self.timeout
        try:
            with httpx.Client(timeout=self.timeout, follow_redirects=True, max_redirects=3) as client, \
                    client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise MediaError(where, f"fetching {_show(url)} failed: HTTP {response.status_code}.")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_bytes:
                    raise MediaError(where, f"{_show(url)} is {int(declared):,} bytes, over the image size limit "
                                            f"of {self.max_bytes:,}.")
                data = bytearray()
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) > self.max_bytes:
                        raise MediaError(where, f"{_show(url)} is over the image size limit of "
                                                f"{self.max_bytes:,} bytes.")
                    if time.monotonic() > deadline:
                        raise httpx.TimeoutException("slow body")
                return bytes(data)
        except httpx.TimeoutException:
            raise MediaError(where, f"fetching {_show(url)} took over {self.timeout:g} s.") from None
        except httpx.HTTPError as exc:
            raise MediaError(where, f"fetching {_show(url)} failed: {type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}.") from None


def _show(url: str) -> str:
    """The URL as an error quotes it: a data: URL would be megabytes of base64."""
    return repr(url if len(url) <= 100 else url[:97] + "...")

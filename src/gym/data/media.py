"""Images, videos and audios in a row: read LLaMA-Factory's media columns and OpenAI content parts, and check the
files before anything trains on them.

A row's media end up as lists of strings on the `Example` (`images`, `videos`, `audios`): a resolved local path or
a `data:` URL, in the order their placeholders (`<image>`, `<video>`, `<audio>`) appear in the text, as
LLaMA-Factory keeps them. Paths are looked up under `media_dir` first (LLaMA-Factory's key; it defaults to the
dataset folder), then as written. A video given as a list of frames (LLaMA-Factory's processed videos) is not read yet.

The checks are the cheap ones, done once when the row is read so a bad row is named by file, row and field instead
of failing mid-training: the file exists and is readable, the placeholder count per kind matches the media count
(across all turns, as LLaMA-Factory's mm_plugin counts), and an image is a real image of a sane size. An image is
opened with Pillow (which reads only the header), its size checked against a pixel limit before any pixel is
decoded (a 20,000 x 20,000 PNG compresses to a few KB and would decode to 400 MB), then `verify()`ed; a JPEG, whose
`verify()` checks nothing, is decoded at 1/8 scale so a truncated one is caught. Decoding full pixels is left to
the model's processor. Videos and audios are only checked to exist: decoding them needs libraries the model side
brings.

`load_image` is the one entry point for an image from anywhere (a path, a data URL, raw bytes), so the serving
side can check a request's base64 image the same way.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym.core.errors import DataError

if TYPE_CHECKING:
    from PIL import Image as PILImage

KINDS = ("images", "videos", "audios")
PLACEHOLDERS = {"images": "<image>", "videos": "<video>", "audios": "<audio>"}
# Pillow's own default decompression-bomb limit (about 89.5 million pixels, e.g. 9,459 x 9,459); far above what any
# vision processor keeps after resizing, so a larger image is a mistake or an attack.
MAX_PIXELS = 89_478_485


class MediaError(DataError):
    """A media item that cannot be used: `where` names it (`images[1]`, `messages[0].content[2]`), `problem` says
    what is wrong in one line; the message is `where: problem`."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where, self.problem = where, problem


def load_image(source: str | bytes | Path, *, where: str, max_pixels: int = MAX_PIXELS) -> PILImage.Image:
    """Check an image (a path, a `data:image/...;base64,` URL or raw bytes) and return it opened lazily (pixels not
    decoded yet). Raises MediaError naming `where` for a missing file, a non-image, a truncated file or one over
    `max_pixels`; never a Pillow traceback."""
    from PIL import Image

    checked: bytes | Path
    if isinstance(source, bytes):
        checked = source
    elif isinstance(source, str) and source.startswith("data:"):
        declared = source[len("data:"):].partition(",")[0].split(";")[0].strip().lower()
        if not declared.startswith("image/"):  # as OpenAI refuses it; the bytes' own format is checked next
            raise MediaError(where, f"the data URL declares {declared or 'no type'!r}, not an image type; send "
                                    "data:image/png;base64,... (or image/jpeg, image/webp, ...).")
        checked = _data_url_bytes(source, where)
    else:
        checked = Path(source)
    _check_image(checked, where, max_pixels)
    return Image.open(io.BytesIO(checked) if isinstance(checked, bytes) else checked)


def _data_url_bytes(url: str, where: str) -> bytes:
    header, _, payload = url.partition(",")
    if not header.endswith(";base64") or not payload:
        raise MediaError(where, "a data URL must look like 'data:<type>;base64,<data>' "
                                "(e.g. data:image/png;base64,...).")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(where, "the data URL's base64 payload is not valid base64.") from None


def _check_image(source: bytes | Path, where: str, max_pixels: int) -> None:
    from PIL import Image, UnidentifiedImageError

    what = "the given bytes" if isinstance(source, bytes) else str(source)
    if isinstance(source, Path) and source.is_dir():
        raise MediaError(where, f"{source} is a folder, not an image file.")
    if isinstance(source, Path) and not source.is_file():
        raise MediaError(where, f"image file not found: {source}")
    try:
        # Pillow warns between its limit and twice it, and raises above: both become the row's error here, and
        # the size check below applies the caller's own limit; Image.MAX_IMAGE_PIXELS is left alone (global).
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
                width, height = image.size
                if width * height > max_pixels:
                    raise MediaError(where, f"image is {width} x {height} = {width * height:,} pixels, over the "
                                     f"limit of {max_pixels:,} (a decompression-bomb guard); shrink it.")
                image.verify()  # structure and checksums (PNG), no pixels
            if image.format == "JPEG":  # JPEG's verify() checks nothing: decode at 1/8 scale to find a cut file
                with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
                    image.draft("RGB", (max(1, width // 8), max(1, height // 8)))
                    image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise MediaError(where, f"image is over Pillow's decompression-bomb limit of {MAX_PIXELS:,} pixels "
                         f"({what}); shrink it.") from None
    except UnidentifiedImageError:
        raise MediaError(where, f"not an image Pillow can read ({what}).") from None
    except PermissionError:
        raise MediaError(where, f"image file is not readable (permission denied): {what}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # Pillow's ways of saying "broken file"
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MediaError(where, f"broken or truncated image ({what}): {reason}.") from None


def _resolve_path(value: str, media_dir: Path | None, where: str) -> Path:
    if value.startswith(("http://", "https://")):
        raise MediaError(where, f"{value[:80]!r} is a web address; Gym reads media from local files or data: "
                         "URLs, so download it first.")
    candidates = [media_dir / value] if media_dir is not None else []
    candidates.append(Path(value).expanduser())
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    looked = " or ".join(str(c) for c in candidates)
    if any(c.is_dir() for c in candidates):  # `""` or a folder's name: it exists, so "not found" would mislead
        raise MediaError(where, f"{value!r} names a folder ({looked}), not a media file.")
    raise MediaError(where, f"file not found: {looked} (paths are relative to media_dir, by default the dataset "
                     "folder).")


def _check_readable(path: Path, where: str) -> None:
    try:
        with path.open("rb") as handle:
            if not handle.read(1):
                raise MediaError(where, f"file is empty: {path}")
    except OSError as exc:
        raise MediaError(where, f"file is not readable ({exc.strerror or exc}): {path}") from None


def resolve_item(kind: str, value: Any, *, where: str, media_dir: Path | None) -> str:
    """One media item -> a resolved path or the data URL itself, checked as `kind` requires."""
    if kind == "videos" and isinstance(value, list):
        raise MediaError(where, "a video given as a list of frames is not read yet; give the video file.")
    if not isinstance(value, str) or not value:
        raise MediaError(where, f"must be a file path or a data: URL, got {type(value).__name__} "
                         f"{str(value)[:40]!r}.")
    if value.startswith("data:"):
        if kind == "images":
            _check_image(_data_url_bytes(value, where), where, MAX_PIXELS)
        else:
            _data_url_bytes(value, where)  # the payload decodes; what it holds is for the model's processor
        return value
    path = _resolve_path(value, media_dir, where)
    if kind == "images":
        _check_image(path, where, MAX_PIXELS)
    else:
        _check_readable(path, where)
    return str(path)


def resolve_media(kind: str, items: Iterable[tuple[str, Any]], media_dir: Path | None) -> list[str]:
    """`(field, value)` pairs of one kind -> resolved items; a file used twice in a row is checked once."""
    resolved: list[str] = []
    seen: dict[str, str] = {}
    for where, value in items:
        key = value if isinstance(value, str) else None
        if key is not None and key in seen:
            resolved.append(seen[key])
            continue
        item = resolve_item(kind, value, where=where, media_dir=media_dir)
        if key is not None:
            seen[key] = item
        resolved.append(item)
    return resolved


def count_placeholders(texts: Iterable[str | None]) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for text in texts:
        for kind, tag in PLACEHOLDERS.items():
            counts[kind] += (text or "").count(tag)
    return counts


def check_counts(given: Mapping[str, int], texts: Iterable[str | None], where: str) -> None:
    """Each kind's placeholders, over all turns, must match its media count (LLaMA-Factory's rule): the processor
    puts an image's tokens where its placeholder is, so a missing or extra one shifts every image after it."""
    found = count_placeholders(texts)
    for kind in KINDS:
        if found[kind] != given.get(kind, 0):
            tag = PLACEHOLDERS[kind]
            raise MediaError(where, f"{given.get(kind, 0)} {kind} given but {found[kind]} {tag} placeholders in "
                             f"the messages; put one {tag} in the text where each of the {kind} goes.")


_PART_KINDS = {"image_url": "images", "image": "images", "input_audio": "audios", "audio_url": "audios",
               "video_url": "videos", "video": "videos"}


def flatten_parts(content: list[Any], where: str) -> tuple[str, list[tuple[str, str, Any]]]:
    """OpenAI content parts -> (text with a placeholder where each media part was, [(kind, field, value)]).

    `image_url` / `video_url` / `audio_url` carry `{"url": ...}` (or the URL itself); `input_audio` carries
    `{"data": <base64>, "format": "wav"}`, kept as a data URL. A bare `{"type": "image"}` (TRL's layout) is a
    placeholder whose file comes from the row's `images` column; its value is None."""
    text: list[str] = []
    media: list[tuple[str, str, Any]] = []
    for j, part in enumerate(content):
        field = f"{where}[{j}]"
        kind = _PART_KINDS.get(part.get("type", "")) if isinstance(part, dict) else None
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
            continue
        if kind is None:
            got = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise MediaError(field, f"unknown content part {got!r}; expected text, image_url, video_url, "
                             "input_audio or audio_url.")
        text.append(PLACEHOLDERS[kind])
        key = part["type"]
        if key in ("image", "video") and key not in part:
            media.append((kind, field, None))
            continue
        value = part.get(key)
        if key == "input_audio":
            if not (isinstance(value, dict) and isinstance(value.get("data"), str)
                    and isinstance(value.get("format"), str)):
                raise MediaError(f"{field}.input_audio", "must be {\"data\": <base64>, \"format\": \"wav\"}.")
            media.append((kind, f"{field}.input_audio", f"data:audio/{value['format']};base64,{value['data']}"))
            continue
        if isinstance(value, dict):
            media.append((kind, f"{field}.{key}.url", value.get("url")))
        else:
            media.append((kind, f"{field}.{key}", value))
    return "".join(text), media


def fit_pixels(image: PILImage.Image, max_pixels: int, min_pixels: int) -> PILImage.Image:
    """An RGB copy scaled (aspect kept) into [min_pixels, max_pixels], as LLaMA-Factory's image_max_pixels and
    image_min_pixels do, before the model's processor resizes it again to what its family takes."""
    import math

    image = image.convert("RGB")
    width, height = image.size
    if width * height > max_pixels:
        factor = math.sqrt(max_pixels / (width * height))
    elif width * height < min_pixels:
        factor = math.sqrt(min_pixels / (width * height))
    else:
        return image
    return image.resize((max(1, int(width * factor)), max(1, int(height * factor))))


def read_image(item: str, *, where: str, max_pixels: int, min_pixels: int) -> PILImage.Image:
    """A checked item (path or data URL) -> decoded RGB pixels within the pixel limits."""
    with load_image(item, where=where) as image:
        return fit_pixels(image, max_pixels, min_pixels)

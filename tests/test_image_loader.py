"""What `load_image` fetches and reads, and what it refuses: remote URLs only when allowed, only
http(s), under a size cap and a timeout; local paths only under the allowed directory, after
`..` and symlinks are resolved; pixel bombs refused before decoding."""

from __future__ import annotations

import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from seq2serve.encoders.image_loader import MediaPolicy, load_image


def _png(w: int = 16, h: int = 12, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(buf, format="PNG")
    return buf.getvalue()


SMALL = _png()
BIG = _png(300, 300, seed=1)  # ~270 kB of noise


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/slow.png":
            time.sleep(3)
        body = {"/small.png": SMALL, "/big.png": BIG, "/slow.png": SMALL,
                "/text": b"not an image"}.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def http_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_remote_urls_are_refused_unless_allowed(http_url):
    with pytest.raises(ValueError, match="disabled"):
        load_image(http_url + "/small.png", MediaPolicy())


def test_allowed_remote_fetch_is_capped_and_timed(http_url):
    policy = MediaPolicy(allow_remote=True, max_bytes=64 << 10, fetch_timeout_s=1.0)
    img, ident = load_image(http_url + "/small.png", policy)
    assert img.size == (16, 12) and ident == SMALL
    with pytest.raises(ValueError, match="larger than 65536 bytes"):
        load_image(http_url + "/big.png", policy)
    start = time.monotonic()
    with pytest.raises(ValueError, match="could not fetch"):
        load_image(http_url + "/slow.png", policy)
    assert time.monotonic() - start < 2.5
    for path, needle in (("/missing.png", "could not fetch"), ("/text", "could not be decoded")):
        with pytest.raises(ValueError, match=needle):
            load_image(http_url + path, policy)


@pytest.mark.parametrize("url", ["ftp://example.com/a.png", "gopher://x/a.png",
                                 "jar:file:///a.png!/b"])
def test_other_schemes_are_refused(url):
    with pytest.raises(ValueError, match="scheme|neither"):
        load_image(url, MediaPolicy(allow_remote=True))


def test_local_paths_stay_inside_the_allowed_directory(tmp_path):
    media, outside = tmp_path / "media", tmp_path / "outside"
    media.mkdir()
    outside.mkdir()
    (media / "a.png").write_bytes(SMALL)
    (outside / "secret.png").write_bytes(SMALL)
    (media / "link.png").symlink_to(outside / "secret.png")
    policy = MediaPolicy(local_media_dir=str(media))

    assert load_image(str(media / "a.png"), policy)[0].size == (16, 12)
    assert load_image("file://" + str(media / "a.png"), policy)[0].size == (16, 12)
    for path in (str(outside / "secret.png"), str(media / ".." / "outside" / "secret.png"),
                 str(media / "link.png"), "file://" + str(outside / "secret.png")):
        with pytest.raises(ValueError, match="must be under"):
            load_image(path, policy)
    # with no local access at all, a path is not even looked up: it is (invalid) base64
    with pytest.raises(ValueError):
        load_image(str(media / "a.png"), MediaPolicy())
    with pytest.raises(ValueError, match="not allowed"):
        load_image("file://" + str(media / "a.png"), MediaPolicy())


def test_pixel_bombs_are_refused_before_decoding():
    bomb = _png(2000, 2000, seed=2)
    policy = MediaPolicy(max_pixels=1_000_000)
    start = time.monotonic()
    with pytest.raises(ValueError, match="2000x2000 pixels, over the limit of 1000000"):
        load_image(bomb, policy)
    with pytest.raises(ValueError, match="over the limit"):
        load_image(Image.new("RGB", (1001, 1000)), policy)
    assert time.monotonic() - start < 1.0
    with pytest.raises(ValueError, match="could not be decoded"):
        load_image(SMALL[:100], MediaPolicy())


def test_near_limit_images_leave_no_memory_behind(tmp_path):
    """32 images of 6300x6300 (just under the default pixel limit) through the tokenizer
    manager's preprocessing threads: the process ends within 150 MB of where it started (it
    was 600+ MB larger for good before the freed buffers were handed back)."""
    import io

    import numpy as np
    import psutil
    from PIL import Image

    from seq2serve.runtime.config.tokenizer import load_tokenizer
    from seq2serve.runtime.frontend.tokenizer_manager import TokenizerManager
    from seq2serve.runtime.tools.demo_checkpoint import write_mllama_checkpoint

    path = str(write_mllama_checkpoint(tmp_path / "m"))
    info = {"is_encoder_decoder": False, "has_vision": True, "dtype": "float32",
            "tokens_per_tile": 5, "encoder_cache": False}
    tm = TokenizerManager(None, load_tokenizer(path), info, path)
    small = (np.random.default_rng(0).random((60, 60, 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(small).resize((6300, 6300), Image.NEAREST).save(buf, format="PNG")
    png = buf.getvalue()
    process = psutil.Process()
    tm._images([[png]])  # warm up: the processor's own first-use allocations
    before = process.memory_info().rss
    for wave in range(4):  # distinct bytes each time: no memo hit
        tm._images([[png + bytes([wave, i]) for i in range(4)] for _ in range(2)])
    grown = (process.memory_info().rss - before) / 2**20
    assert grown < 150, f"{grown:.0f} MB more resident"

"""gpumem.share() and gpumem.open() (issue 27) on the host backend without
torch: a child process shares a set of buffers and exits; this process opens
them read-only, zero copy, with the layout and bytes the child wrote; the
mapping lasts while a view lives; unpublishing gives the bytes back."""
import array
import ctypes
import errno
import gc
import json
import subprocess
import sys

import pytest

from conftest import pytorch_env

MiB = 1 << 20

# The publisher: three tensors of different types and shapes, then exits.
PUBLISHER = r"""
import array, sys
import gpumem
weights = {
    "embed": memoryview(array.array("f", [i * 0.5 for i in range(3 * 1000)])).cast("B").cast("f", [3, 1000]),
    "bias": array.array("q", range(-7, 10)),
    "raw": bytes(range(256)) * 4096 + b"tail",
}
print(gpumem.share(sys.argv[1], weights, retention=int(sys.argv[2])), flush=True)
"""


def publish(name, retention=0):
    out = subprocess.run([sys.executable, "-c", PUBLISHER, name, str(retention)], capture_output=True, text=True,
                         env=pytorch_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def charged(gpumem):
    return gpumem.get_quota()["charged_bytes"]


def raw_layout(gpumem, name):
    """The object's meta as the daemon keeps it, through the C API."""
    lib, client = gpumem._lib.lib, gpumem._session(None)
    handle = gpumem._lib.c_shared_p()
    assert lib.gpumem_shared_open(client, name.encode(), 0, ctypes.byref(handle)) == 0
    try:
        meta, size = ctypes.c_void_p(), ctypes.c_size_t()
        assert lib.gpumem_shared_meta(handle, ctypes.byref(meta), ctypes.byref(size)) == 0
        return json.loads(ctypes.string_at(meta.value, size.value)), lib.gpumem_shared_size(handle)
    finally:
        lib.gpumem_shared_close(client, handle)


def test_open_after_the_publisher_exited(gpumem):
    before = charged(gpumem)
    version = publish("py-weights")
    assert version >= 1
    held = charged(gpumem) - before
    assert held >= 256 * 4096  # charged to the tenant after its publisher is gone

    tensors = gpumem.open("py-weights")
    assert list(tensors) == ["embed", "bias", "raw"]
    embed, bias, raw = tensors["embed"], tensors["bias"], tensors["raw"]
    assert embed.format == "f" and embed.shape == (3, 1000) and embed.readonly
    assert embed.tolist()[2][999] == 2999 * 0.5 and embed.tolist()[0][:3] == [0.0, 0.5, 1.0]
    assert bias.format == "q" and bias.tolist() == list(range(-7, 10))
    assert raw.format == "B" and raw.tobytes() == bytes(range(256)) * 4096 + b"tail"
    with pytest.raises(TypeError):
        embed[0, 0] = 1.0
    with pytest.raises(TypeError):
        raw[0] = 1

    doc, size = raw_layout(gpumem, "py-weights")
    assert doc["format"] == "gpumem.tensors/1"
    layout = doc["tensors"]
    assert layout["embed"] == {"dtype": "float32", "typestr": "<f4", "shape": [3, 1000], "strides": [1000, 1],
                               "offset": 0, "nbytes": 12000}
    assert layout["bias"]["dtype"] == "int64" and layout["bias"]["offset"] == 12032  # aligned to 256
    assert layout["raw"]["offset"] % 256 == 0 and layout["raw"]["nbytes"] == 256 * 4096 + 4
    assert layout["raw"]["offset"] + layout["raw"]["nbytes"] <= size

    # A slice keeps the mapping; the last view gone closes it.
    head = raw[:16]
    del tensors, embed, bias, raw
    gc.collect()
    assert head.tobytes() == bytes(range(16))
    del head
    gc.collect()
    assert gpumem.close("py-weights") == 0  # nothing left open

    gpumem.unpublish("py-weights")
    with pytest.raises(gpumem.GpumemError) as refused:
        gpumem.open("py-weights")
    assert refused.value.errno == errno.ENOENT
    assert charged(gpumem) == before  # released with its last mapper


def test_close_and_versions(gpumem):
    first, second = publish("py-versions"), publish("py-versions")
    assert second == first + 1
    newest, old = gpumem.open("py-versions"), gpumem.open("py-versions", version=first)
    assert newest["bias"].tolist() == old["bias"].tolist()
    assert gpumem.close("py-versions") == 2  # both mappings, though their views live
    gpumem.unpublish("py-versions", version=first)
    gpumem.open("py-versions", version=second)
    with pytest.raises(gpumem.GpumemError):
        gpumem.open("py-versions", version=first)
    gpumem.close("py-versions")
    gpumem.unpublish("py-versions")


def test_share_checks_its_input(gpumem):
    with pytest.raises(ValueError):
        gpumem.share("py-empty", {})
    with pytest.raises(TypeError):
        gpumem.share("py-bad", {"x": 3})
    with pytest.raises(ValueError):
        gpumem.share("py-strided", {"x": memoryview(array.array("i", range(8)))[::2]})
    version = gpumem.share("py-here", {"x": array.array("d", [1.5, 2.5])}, readers=["*"])
    assert gpumem.open("py-here", version)["x"].tolist() == [1.5, 2.5]
    gpumem.close("py-here")
    gpumem.unpublish("py-here")


def test_meta_of_another_kind_is_refused(gpumem):
    lib, client = gpumem._lib.lib, gpumem._session(None)
    handle, ptr = gpumem._lib.c_shared_p(), ctypes.c_void_p()
    assert lib.gpumem_shared_create(client, b"py-foreign", MiB, ctypes.byref(handle), ctypes.byref(ptr)) == 0
    version = ctypes.c_uint64()
    assert lib.gpumem_shared_publish(client, handle, None, b"layout", 6, 0, ctypes.byref(version)) == 0
    lib.gpumem_shared_close(client, handle)
    with pytest.raises(ValueError):
        gpumem.open("py-foreign")
    gpumem.unpublish("py-foreign")


OPEN_AS_READER = r"""
import gpumem
try:
    x = gpumem.open("%s")["x"]
except PermissionError as e:
    print("refused", e.errno)
else:
    print("read", x.tolist())
    try:
        x[0] = 0.0
    except TypeError:
        print("read-only")
"""


def test_readers_admit_tenants(gpumem):
    from test_gpumem import run_as_nobody
    gpumem.share("py-private", {"x": array.array("d", [4.0, 2.0])})
    gpumem.share("py-for-nobody", {"x": array.array("d", [4.0, 2.0])}, readers=["uid:65534"])
    try:
        out = run_as_nobody(OPEN_AS_READER % "py-private")
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["refused", str(errno.EACCES)]
        out = run_as_nobody(OPEN_AS_READER % "py-for-nobody")
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == ["read [4.0, 2.0]", "read-only"]
    finally:
        gpumem.unpublish("py-private")
        gpumem.unpublish("py-for-nobody")

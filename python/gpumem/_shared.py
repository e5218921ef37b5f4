"""gpumem.share(), open(), close() and unpublish(): a set of tensors (a
state_dict) published once as a read-only shared object (docs/shared.md) and
mapped, zero copy, by any process of an admitted tenant: model weights loaded
once for every engine on the GPU, kept after the loader exits.

Internal: the public names are in gpumem/__init__.py. The layout travels as
the object's meta, JSON:
    {"format": "gpumem.tensors/1",
     "tensors": {name: {"dtype", "typestr", "shape", "strides", "offset", "nbytes"}}}
each tensor C-contiguous at an offset aligned to ALIGN bytes, in the dict's
order; strides count elements as torch does; dtype is torch's name
("float32", "bfloat16") or null for a buffer of another type; typestr is the
array interface's ("<f4").
"""
import ctypes
import errno as _errno
import json
import struct
import sys
import threading
import warnings
import weakref

from . import _lib

ALIGN = 256
FORMAT = "gpumem.tensors/1"

# torch's dtype names and the array interface's typestr (little-endian hosts).
_TORCH_TYPESTR = {
    "float64": "<f8", "float32": "<f4", "float16": "<f2", "bfloat16": "<V2",
    "int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "|i1", "uint8": "|u1", "bool": "|b1",
    "complex64": "<c8", "complex128": "<c16",
}
# A memoryview's format character for a typestr it can express.
_TYPESTR_FORMAT = {
    "<f8": "d", "<f4": "f", "<f2": "e", "<i8": "q", "<i4": "i", "<i2": "h", "|i1": "b",
    "<u8": "Q", "<u4": "I", "<u2": "H", "|u1": "B", "|b1": "?",
}
_TYPESTR_DTYPE = {v: k for k, v in _TORCH_TYPESTR.items()}


# A struct format character's kind: float, signed, unsigned or bool.
_FORMAT_KIND = {"d": "f", "f": "f", "e": "f", "b": "i", "h": "i", "i": "i", "l": "i", "q": "i", "n": "i",
                "B": "u", "H": "u", "I": "u", "L": "u", "Q": "u", "N": "u", "?": "b"}


def _format_typestr(fmt, itemsize):
    """The typestr of a buffer's struct format ("f", "<q", "@l"); |V<n> when none fits."""
    code = fmt.lstrip("@=<")
    kind = _FORMAT_KIND.get(code)
    if kind is None or struct.calcsize(code) != itemsize:
        return f"|V{itemsize}"
    return ("|" if itemsize == 1 else "<") + kind + str(itemsize)


class _Source:
    """One tensor to share: how it is laid out and where its bytes are."""

    def __init__(self, key, value):
        if not isinstance(key, str) or not key:
            raise TypeError(f"gpumem.share: tensor names are non-empty strings, not {key!r}")
        torch = sys.modules.get("torch")
        self.tensor = self.view = None
        if torch is not None and isinstance(value, torch.Tensor):
            self.tensor = value.detach().contiguous()
            self.dtype = str(self.tensor.dtype).replace("torch.", "")
            self.typestr = _TORCH_TYPESTR.get(self.dtype, f"|V{self.tensor.element_size()}")
            self.shape = list(self.tensor.shape)
            self.nbytes = self.tensor.numel() * self.tensor.element_size()
        elif hasattr(value, "__cuda_array_interface__"):
            cai = value.__cuda_array_interface__
            self.shape, self.typestr = list(cai["shape"]), cai["typestr"]
            itemsize = int(self.typestr[2:])
            if cai.get("strides") not in (None, tuple(_strides(self.shape, itemsize))):
                raise ValueError(f"gpumem.share: {key}: only C-contiguous arrays are shared")
            self.dtype = _TYPESTR_DTYPE.get(self.typestr)
            self.nbytes = itemsize * _count(self.shape)
            self.cuda = value
        else:
            try:
                view = memoryview(value)
            except TypeError:
                raise TypeError(f"gpumem.share: {key}: a torch tensor, an object with "
                                f"__cuda_array_interface__ or a buffer, not {type(value).__name__}") from None
            if not view.c_contiguous:
                raise ValueError(f"gpumem.share: {key}: only C-contiguous buffers are shared")
            self.view = view
            self.typestr = _format_typestr(view.format, view.itemsize)
            self.dtype = _TYPESTR_DTYPE.get(self.typestr)
            self.shape = list(view.shape)
            self.nbytes = view.nbytes
        self.itemsize = int(self.typestr[2:])
        self.strides = [s // self.itemsize for s in _strides(self.shape, self.itemsize)]

    def layout(self, offset):
        return {"dtype": self.dtype, "typestr": self.typestr, "shape": self.shape, "strides": self.strides,
                "offset": offset, "nbytes": self.nbytes}

    def copy_to(self, address, cuda, index):
        """Copies the bytes to staging memory at `address` (device memory on cuda)."""
        if self.nbytes == 0:
            return
        torch = sys.modules.get("torch")
        if self.view is not None and not cuda:  # host to host: no torch needed
            dst = memoryview((ctypes.c_char * self.nbytes).from_address(address)).cast("B")
            dst[:] = self.view.cast("B")
            return
        if torch is None:
            raise _lib_error(_errno.EOPNOTSUPP, "copying device memory needs torch")
        if self.tensor is not None:
            src = self.tensor
        elif self.view is not None:
            with warnings.catch_warnings():  # a read-only buffer is only read here
                warnings.simplefilter("ignore")
                src = torch.frombuffer(self.view.cast("B"), dtype=torch.uint8)
        else:
            src = torch.as_tensor(self.cuda, device="cuda")
        src = src.reshape(-1).view(torch.uint8)
        if cuda:
            dst = torch.as_tensor(_Interface(address, (self.nbytes,), "|u1", False), device=torch.device("cuda", index))
        else:
            dst = torch.frombuffer((ctypes.c_char * self.nbytes).from_address(address), dtype=torch.uint8)
        dst.copy_(src)
        if cuda or src.is_cuda:
            torch.cuda.synchronize(src.device if src.is_cuda else index)


def _count(shape):
    n = 1
    for dim in shape:
        n *= int(dim)
    return n


def _strides(shape, itemsize):
    """C-contiguous strides in bytes."""
    out, step = [], itemsize
    for dim in reversed(shape):
        out.append(step)
        step *= max(int(dim), 1)
    return list(reversed(out))


def _align(offset):
    return (offset + ALIGN - 1) // ALIGN * ALIGN


class _Interface:
    """Device memory of a shared object as __cuda_array_interface__ (version 3)
    describes it; keeps its mapping open while it lives."""

    def __init__(self, address, shape, typestr, readonly, mapping=None):
        self.ptr, self.shape, self.typestr, self.readonly = address, tuple(shape), typestr, readonly
        self._mapping = mapping

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.ptr, self.readonly), "strides": None,
                "version": 3}

    def __repr__(self):
        return f"<gpumem shared tensor {self.typestr} {list(self.shape)} at 0x{self.ptr:x}>"


class _Mapping:
    """One open handle of a shared object; closed when the last object viewing
    it is collected, or by gpumem.close()."""

    def __init__(self, client, handle):
        self.close = weakref.finalize(self, _lib.lib.gpumem_shared_close, client, handle)


_lock = threading.Lock()
_mappings = {}  # name -> weakref.WeakSet of its _Mapping objects in this process
_backends = {}  # device index -> "host" or "cuda"


def _lib_error(code, text):
    from . import GpumemError
    return GpumemError(code, f"gpumem: {text}")


def _backend(index):
    """The memory kind of the daemon of device `index`, from its hello."""
    with _lock:
        known = _backends.get(index)
    if known is not None:
        return known
    lib = _lib.lib
    path = ctypes.create_string_buffer(4096)
    r = lib.gpumem_admin_socket(index, path, len(path))
    admin = _lib.c_admin_p()
    if r >= 0:
        r = lib.gpumem_admin_new(path.value, b"gpumem-python", ctypes.byref(admin))
    try:
        if r >= 0:
            r = lib.gpumem_admin_connect(admin)
        if r < 0:
            raise _lib_error(-r, f"cuda:{index}: {lib.gpumem_strerror(r).decode()}")
        kind = lib.gpumem_admin_backend(admin).decode()
    finally:
        lib.gpumem_admin_free(admin)
    with _lock:
        _backends[index] = kind
    return kind


def share(name, tensors, readers=None, retention=0, device=None):
    from . import _check, _device_index, _session
    sources = [(key, _Source(key, value)) for key, value in dict(tensors).items()]
    if not sources:
        raise ValueError("gpumem.share: no tensors to share")
    layout, offset = {}, 0
    for key, src in sources:
        offset = _align(offset)
        layout[key] = src.layout(offset)
        offset += src.nbytes
    meta = json.dumps({"format": FORMAT, "tensors": layout}, separators=(",", ":")).encode()
    names = None
    if readers is not None:
        readers = [readers] if isinstance(readers, str) else list(readers)
        names = (ctypes.c_char_p * (len(readers) + 1))(*[r.encode() for r in readers], None)
    index = _device_index(device)
    cuda = _backend(index) == "cuda"
    client = _session(device)
    lib = _lib.lib
    handle, address = _lib.c_shared_p(), ctypes.c_void_p()
    _check(lib.gpumem_shared_create(client, name.encode(), max(offset, 1), ctypes.byref(handle), ctypes.byref(address)),
           client, f"gpumem: share {name}")
    try:
        for key, src in sources:
            src.copy_to(address.value + layout[key]["offset"], cuda, index)
        version = ctypes.c_uint64()
        _check(lib.gpumem_shared_publish(client, handle, names, meta, len(meta), int(retention), ctypes.byref(version)),
               client, f"gpumem: share {name}")
        return version.value
    finally:
        lib.gpumem_shared_close(client, handle)  # published: open() maps it again


def _read_layout(handle, name):
    meta, size = ctypes.c_void_p(), ctypes.c_size_t()
    lib = _lib.lib
    if lib.gpumem_shared_meta(handle, ctypes.byref(meta), ctypes.byref(size)) < 0 or not meta.value:
        raise ValueError(f"gpumem.open: {name} has no tensor layout")
    try:
        doc = json.loads(ctypes.string_at(meta.value, size.value).decode())
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"gpumem.open: {name}'s meta is not a tensor layout") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("tensors"), dict):
        raise ValueError(f"gpumem.open: {name}'s meta is not a {FORMAT} layout")
    total = lib.gpumem_shared_size(handle)
    for key, entry in doc["tensors"].items():
        itemsize = int(entry["typestr"][2:])
        if entry["nbytes"] != itemsize * _count(entry["shape"]) or entry["offset"] < 0 or \
                entry["offset"] + entry["nbytes"] > total:
            raise ValueError(f"gpumem.open: {name}: tensor {key} lies outside the object")
    return doc["tensors"]


def _view(address, entry, cuda, index, mapping):
    """One tensor of a mapping: torch's when torch is loaded, else an array
    interface (cuda) or a read-only memoryview (host)."""
    torch = sys.modules.get("torch")
    nbytes, shape = entry["nbytes"], entry["shape"]
    if torch is not None:
        dtype = getattr(torch, entry["dtype"] or "uint8")
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=torch.device("cuda", index) if cuda else "cpu")
        if cuda:
            raw = torch.as_tensor(_Interface(address, (nbytes,), "|u1", True, mapping),
                                  device=torch.device("cuda", index))
        else:
            with warnings.catch_warnings():  # read-only memory: torch cannot say so
                warnings.simplefilter("ignore")
                raw = torch.frombuffer(_host_view(address, nbytes, mapping), dtype=torch.uint8)
        return raw.view(dtype).view(shape) if entry["dtype"] else raw
    if cuda:
        return _Interface(address, shape, entry["typestr"], True, mapping)
    fmt = _TYPESTR_FORMAT.get(entry["typestr"], "B")
    if nbytes == 0:
        return memoryview(b"").cast(fmt)
    view = _host_view(address, nbytes, mapping)
    return view.cast(fmt, shape) if fmt != "B" or shape == [nbytes] else view


def _host_view(address, nbytes, mapping):
    memory = (ctypes.c_char * nbytes).from_address(address)
    memory._gpumem_mapping = mapping  # the memoryview keeps `memory`, `memory` the mapping
    return memoryview(memory).toreadonly().cast("B")


def open(name, version=0, device=None):
    from . import _check, _device_index, _session
    index = _device_index(device)
    cuda = _backend(index) == "cuda"
    client = _session(device)
    lib = _lib.lib
    handle = _lib.c_shared_p()
    _check(lib.gpumem_shared_open(client, name.encode(), int(version), ctypes.byref(handle)), client,
           f"gpumem: open {name}")
    try:
        layout = _read_layout(handle, name)
    except BaseException:
        lib.gpumem_shared_close(client, handle)
        raise
    mapping = _Mapping(client, handle)
    with _lock:
        _mappings.setdefault(name, weakref.WeakSet()).add(mapping)
    base = lib.gpumem_shared_ptr(handle)
    return {key: _view(base + entry["offset"], entry, cuda, index, mapping) for key, entry in layout.items()}


def close(name):
    with _lock:
        found = list(_mappings.pop(name, ()))
    for mapping in found:
        mapping.close()
    return len(found)


def unpublish(name, version=0, device=None):
    from . import _check, _session
    client = _session(device)
    _check(_lib.lib.gpumem_shared_unpublish(client, name.encode(), int(version)), client, f"gpumem: unpublish {name}")

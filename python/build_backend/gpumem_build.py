"""PEP 517 build backend of the gpumem Python package (python/pyproject.toml).

Standard library only, so `pip install ./python` and scripts/build-wheel.sh
work offline. The wheel holds python/gpumem and, when libraries are found,
libgpumem.so.0 and libgpumem_torch.so.0 in gpumem/_libs with a _libdir.py
that points the package there (gpumem/_lib.py looks in $GPUMEM_LIBRARY_DIR,
then _libdir.py's LIBDIR, then the loader's path). The libraries come from
$GPUMEM_WHEEL_LIBDIR, else the build's lib/ directory next to this tree
(build/lib, `make build`); without either the wheel is pure Python and the
package uses the system's libraries (the Debian packages). The socket is
libgpumem's choice: the system daemon's /run/gpumem/gpu0.sock when it runs.
"""
import base64
import hashlib
import os
import re
import sysconfig
import zipfile

NAME = "gpumem"
LIBRARIES = ("libgpumem.so.0", "libgpumem_torch.so.0")
HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
SOURCE_DIR = os.path.dirname(PYTHON_DIR)


def _version():
    """The project's version, from the top CMakeLists.txt's project()."""
    try:
        with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as f:
            m = re.search(r"project\(\s*gpumemd\s+VERSION\s+([0-9.]+)", f.read())
        return m.group(1) if m else "0"
    except OSError:
        return "0"


def _libdir(config_settings):
    """The directory whose libraries the wheel carries, or None."""
    candidates = [(config_settings or {}).get("libdir"), os.environ.get("GPUMEM_WHEEL_LIBDIR"),
                  os.path.join(SOURCE_DIR, "build", "lib")]
    for i, d in enumerate(candidates):
        if not d:
            continue
        if all(os.path.exists(os.path.join(d, lib)) for lib in LIBRARIES):
            return d
        if i < 2:
            raise FileNotFoundError(f"gpumem wheel: {d} lacks {' or '.join(LIBRARIES)}")
    return None


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _metadata(version):
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n"
            "Summary: Python bindings of gpumemd, a per-GPU memory broker\n"
            "Requires-Python: >=3.8\n")


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    libdir = _libdir(config_settings)
    tag = "py3-none-" + (sysconfig.get_platform().replace("-", "_").replace(".", "_") if libdir else "any")
    files = []
    package = os.path.join(PYTHON_DIR, NAME)
    for name in sorted(os.listdir(package)):
        if name.endswith(".py") and name != "_libdir.py":
            with open(os.path.join(package, name), "rb") as f:
                files.append((f"{NAME}/{name}", f.read(), 0o644))
    if libdir:
        for lib in LIBRARIES:
            with open(os.path.realpath(os.path.join(libdir, lib)), "rb") as f:
                files.append((f"{NAME}/_libs/{lib}", f.read(), 0o755))
        files.append((f"{NAME}/_libdir.py",
                      b"# Written by the wheel build: the libraries this wheel carries.\n"
                      b"import os\n\nLIBDIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), \"_libs\")\n",
                      0o644))
    info = f"{NAME}-{version}.dist-info"
    files.append((f"{info}/METADATA", _metadata(version).encode(), 0o644))
    files.append((f"{info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: gpumem_build\n"
                                    f"Root-Is-Purelib: {'false' if libdir else 'true'}\nTag: {tag}\n").encode(), 0o644))
    record = [_record_line(arcname, data) for arcname, data, _ in files] + [f"{info}/RECORD,,"]
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    wheel_name = f"{NAME}-{version}-{tag}.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data, mode in files:
            zi = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return wheel_name

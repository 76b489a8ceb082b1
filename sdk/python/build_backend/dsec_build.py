"""A PEP 517 build backend for libdsec that needs nothing but the standard
library, so ``pip install ./sdk/python`` works offline, in any virtual
environment, without setuptools.

It builds a pure-Python wheel (py3-none-any) of the libdsec package, an
editable wheel (PEP 660: a .pth file pointing at this directory) and a
source archive.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

NAME = "libdsec"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(HERE, NAME)
SUMMARY = "Python client of the dsec sandbox platform (standard library only)"
REQUIRES_PYTHON = ">=3.9"
# Files of the package that go into the wheel.
PACKAGE_FILES = re.compile(r"^[A-Za-z0-9_]+\.py$|^py\.typed$")
# Zip timestamps: fixed, so that a build is reproducible.
EPOCH = (2020, 1, 1, 0, 0, 0)


def _version():
    with open(os.path.join(PACKAGE, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if m is None:
        raise RuntimeError("no __version__ in libdsec/__init__.py")
    return m.group(1)


def _metadata():
    readme = ""
    path = os.path.join(HERE, "README.md")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            readme = f.read()
    head = [
        "Metadata-Version: 2.1",
        "Name: " + NAME,
        "Version: " + _version(),
        "Summary: " + SUMMARY,
        "Requires-Python: " + REQUIRES_PYTHON,
        "Classifier: Programming Language :: Python :: 3",
        "Classifier: Framework :: AsyncIO",
        "Description-Content-Type: text/markdown",
    ]
    return ("\n".join(head) + "\n\n" + readme).encode("utf-8")


def _dist_info():
    return "%s-%s.dist-info" % (NAME, _version())


def _wheel_name():
    return "%s-%s-py3-none-any.whl" % (NAME, _version())


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def _write_wheel(wheel_directory, files):
    """Write a wheel holding files (archive path -> bytes) and the
    dist-info; return its name."""
    info = _dist_info()
    files = dict(files)
    files[info + "/METADATA"] = _metadata()
    files[info + "/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: dsec_build\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n").encode()
    files[info + "/top_level.txt"] = (NAME + "\n").encode()
    record = [_record_line(p, d) for p, d in sorted(files.items())]
    record.append(info + "/RECORD,,")
    files[info + "/RECORD"] = ("\n".join(record) + "\n").encode()
    name = _wheel_name()
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(files):
            zi = zipfile.ZipInfo(path, EPOCH)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, files[path])
    return name


def _package_files():
    out = {}
    for name in sorted(os.listdir(PACKAGE)):
        if PACKAGE_FILES.match(name):
            with open(os.path.join(PACKAGE, name), "rb") as f:
                out[NAME + "/" + name] = f.read()
    return out


# --- PEP 517 hooks -----------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = _dist_info()
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "wb") as f:
        f.write(_metadata())
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, {"_libdsec_editable.pth": (HERE + "\n").encode()})


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (NAME, _version())
    name = base + ".tar.gz"
    skip = re.compile(r"(^|/)(__pycache__|\.[^/]*|build|dist|[^/]*\.egg-info)(/|$)|\.pyc$")
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for root, dirs, files in os.walk(HERE):
            dirs.sort()
            for fn in sorted(files):
                full = os.path.join(root, fn)
                rel = os.path.relpath(full, HERE).replace(os.sep, "/")
                if skip.search(rel):
                    continue
                ti = tf.gettarinfo(full, base + "/" + rel)
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                ti.mtime = int(time.mktime(EPOCH + (0, 0, -1)))
                with open(full, "rb") as f:
                    tf.addfile(ti, f)
        pkg_info = tarfile.TarInfo(base + "/PKG-INFO")
        data = _metadata()
        pkg_info.size = len(data)
        tf.addfile(pkg_info, io.BytesIO(data))
    return name

"""ckalloc for Python programs: the preload library (``libckalloc_preload.so``)
installed with this package, and the statistics of the process it runs in.

Run a program under the library with the ``ckalloc`` command (or
``python -m ckalloc`` where scripts are not on ``PATH``)::

    ckalloc run -- python serve.py

and read what it did from inside that program::

    import ckalloc
    if ckalloc.is_active():
        print(ckalloc.stats()["tiers"]["thp"])

Standard library only. Linux with glibc, x86_64.
"""

import ctypes
import json
import os

__all__ = ["library_path", "is_active", "stats", "NotActiveError"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIBRARY = "libckalloc_preload.so"
_STATS_SYMBOL = "ckalloc_stats_json"


class NotActiveError(RuntimeError):
    """The preload library is not loaded into this process."""


def library_path():
    """The absolute path of the preload library this package installed (put
    it in ``LD_PRELOAD``, or use ``ckalloc run``). Raises ``FileNotFoundError``
    when the package was installed without it."""
    path = os.path.join(_HERE, "lib", _LIBRARY)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: the ckalloc package holds no preload library")
    return path


class _DlInfo(ctypes.Structure):
    """glibc's ``Dl_info`` (``dladdr(3)``)."""
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _address(f):
    return ctypes.cast(f, ctypes.c_void_p).value


def _stats_function():
    """The exported ``ckalloc_stats_json`` of the preload library that serves
    this process's ``malloc``, or ``None``: the dynamic loader's global scope
    must answer both ``ckalloc_stats_json`` and ``malloc`` from the same
    library (``dladdr(3)`` names the file, opened again with
    ``RTLD_NOLOAD``), so a copy loaded with ``ctypes``, or one preloaded after
    another allocator, does not count."""
    process = ctypes.CDLL(None)
    try:
        f = getattr(process, _STATS_SYMBOL)
        dladdr = process.dladdr
    except AttributeError:
        return None
    info = _DlInfo()
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    if not dladdr(_address(f), ctypes.byref(info)) or not info.dli_fname:
        return None
    try:
        lib = ctypes.CDLL(os.fsdecode(info.dli_fname), mode=os.RTLD_NOLOAD)
        if _address(lib.malloc) != _address(process.malloc):
            return None
    except (OSError, AttributeError):
        return None
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return f


def is_active():
    """Whether this process runs under the preload library: it was preloaded,
    so its ``malloc`` serves the process (a copy only loaded with ``ctypes``,
    or one preloaded after another allocator, does not)."""
    return _stats_function() is not None


def stats():
    """This process's statistics from the preload library as a dict: the
    preload counters (``stats()["preload"]``: huge blocks served, bytes
    requested, threshold, retention cap, what glibc's mmap and trim thresholds
    were set to), the blocks and bytes of each tier
    (``"tiers"``: ``hugetlb``, ``thp``, ``normal``), live, retained, purged and
    collapsed bytes, the background thread's state, the THP settings and every
    ``CKALLOC_*`` setting with where it came from. Sizes are bytes, times
    nanoseconds. Each number is read at the call (no snapshot of one moment).
    Raises ``NotActiveError`` when the library is not loaded."""
    f = _stats_function()
    if f is None:
        raise NotActiveError(
            "the ckalloc preload library is not loaded in this process: start it with "
            "`ckalloc run -- python ...` (or LD_PRELOAD=" + _LIBRARY + ")"
        )
    size = 16384
    while True:
        buf = ctypes.create_string_buffer(size)
        n = f(buf, size)
        if n < size:
            return json.loads(buf.raw[:n].decode("utf-8"))
        size = n + 1

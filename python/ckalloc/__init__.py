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
    """The preload library does not serve this process (``stats()``'s message
    says why)."""


def library_path():
    """The absolute path of the preload library this package installed (put
    it in ``LD_PRELOAD``, or use ``ckalloc run``). Raises ``FileNotFoundError``
    when the package was installed without it."""
    path = os.path.join(_HERE, "lib", _LIBRARY)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: the ckalloc package holds no preload library")
    return path


def _stats_function():
    """The ``ckalloc_stats_json`` the dynamic loader's global scope answers
    with (the preload library's, or a copy opened with ``RTLD_GLOBAL``), or
    ``None``."""
    try:
        f = getattr(ctypes.CDLL(None), _STATS_SYMBOL)
    except AttributeError:
        return None
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return f


def _read(f):
    size = 16384
    while True:
        buf = ctypes.create_string_buffer(size)
        n = f(buf, size)
        if n < size:
            return json.loads(buf.raw[:n].decode("utf-8"))
        size = n + 1


def _serving_stats():
    """(the statistics, ``None``) when the library serves this process, else
    (``None``, why not)."""
    f = _stats_function()
    if f is None:
        return None, ("the ckalloc preload library is not loaded in this process: start it with "
                      "`ckalloc run -- python ...` (or LD_PRELOAD=" + _LIBRARY + ")")
    s = _read(f)
    preload = s["preload"]
    serves = preload.get("serves", "absent")
    if serves is True:
        return s, None
    if serves == "absent":
        return None, ("the preloaded ckalloc library is older than this package and does not say "
                      "whether it serves this process: run the program with this package's "
                      "`ckalloc run -- python ...`")
    if serves is None:
        return None, "the ckalloc preload library has not finished loading in this process"
    ahead = preload.get("ahead")
    if ahead is None:
        return None, ("the ckalloc preload library was opened after libc (ctypes, dlopen) and is "
                      "not this process's allocator: start the program with `ckalloc run -- "
                      "python ...`")
    where = ("the program itself" if ahead["program"] else
             ("..." if ahead["cut"] else "") + ahead["object"] + ", loaded ahead of it")
    return None, (f"the ckalloc preload library is loaded but not this process's allocator: "
                  f"its `{ahead['function']}` goes first to {where} (put the library first in "
                  f"LD_PRELOAD, or use `ckalloc run`)")


def is_active():
    """Whether the preload library serves this process's allocator calls: it
    was preloaded, ahead of libc and of any other allocator, as the library
    itself found when it loaded (``stats()["preload"]["serves"]``). A copy
    only loaded with ``ctypes``, or one preloaded behind another allocator,
    does not."""
    return _serving_stats()[0] is not None


def stats():
    """This process's statistics from the preload library as a dict: the
    preload counters (``stats()["preload"]``: huge blocks served, bytes
    requested, threshold, retention cap, what glibc's mmap and trim thresholds
    were set to), the blocks and bytes of each tier
    (``"tiers"``: ``hugetlb``, ``thp``, ``normal``), live, retained, purged and
    collapsed bytes, the background thread's state, the THP settings and every
    ``CKALLOC_*`` setting with where it came from. Sizes are bytes, times
    nanoseconds. Each number is read at the call (no snapshot of one moment).
    Raises ``NotActiveError``, saying why, when the library does not serve
    this process (not loaded, opened after libc, or behind another
    allocator)."""
    s, why = _serving_stats()
    if s is None:
        raise NotActiveError(why)
    return s

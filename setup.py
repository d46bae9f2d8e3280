"""Builds the wheel's two Rust artifacts with setuptools-rust.

Why setuptools-rust: the package ships two crates of this workspace, the
`ckalloc` program (the root crate, feature `cli`) and the preload library
(`preload/`, a plain cdylib with no Python binding). maturin builds one crate
per wheel and has no binding for a plain cdylib; setuptools-rust builds any
number of crates, a program (`Binding.Exec`) and a cdylib
(`Binding.NoBinding`), each into the package directory.

Layout in the package: `ckalloc/bin/ckalloc` and
`ckalloc/lib/libckalloc_preload.so`, the install-prefix layout in which the
program finds the library (`../lib` from itself).

The wheel's tag is `py3-none-manylinux_2_N_<arch>`: no Python ABI is used
(ctypes loads nothing of ours; the program and the library are plain ELF
files), and N is the newest glibc symbol version the two files require,
read from their bytes, so the tag promises no older glibc than they need.
"""

import os
import re

from setuptools import setup
from setuptools_rust import Binding, RustExtension
from setuptools_rust.build import build_rust

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

LIBRARY = "ckalloc.lib.libckalloc_preload"


class BuildRust(build_rust):
    """The preload library keeps its own file name (no Python ABI suffix):
    `ckalloc run` and `LD_PRELOAD` users look for `libckalloc_preload.so`."""

    def get_dylib_ext_path(self, ext, target_fname):
        path = super().get_dylib_ext_path(ext, target_fname)
        if target_fname == LIBRARY:
            return os.path.join(os.path.dirname(path), "libckalloc_preload.so")
        return path


def glibc_minor(paths):
    """The newest `GLIBC_2.N` symbol version the ELF files at `paths` name."""
    newest = 17
    for p in paths:
        with open(p, "rb") as f:
            for m in re.finditer(rb"GLIBC_2\.(\d+)", f.read()):
                newest = max(newest, int(m.group(1)))
    return newest


class BdistWheel(bdist_wheel):
    def get_tag(self):
        _, _, plat = super().get_tag()
        arch = plat.split("_", 1)[1] if plat.startswith("linux_") else plat.rsplit("_", 1)[-1]
        build = self.get_finalized_command("build").build_lib
        files = [os.path.join(build, "ckalloc", "bin", "ckalloc"),
                 os.path.join(build, "ckalloc", "lib", "libckalloc_preload.so")]
        if not all(os.path.isfile(f) for f in files):
            return "py3", "none", plat
        return "py3", "none", f"manylinux_2_{glibc_minor(files)}_{arch}"


setup(
    rust_extensions=[
        RustExtension(
            "ckalloc.bin.ckalloc",
            path="Cargo.toml",
            binding=Binding.Exec,
            features=["cli"],
            args=["--locked", "--bin", "ckalloc"],
        ),
        RustExtension(
            LIBRARY,
            path="preload/Cargo.toml",
            binding=Binding.NoBinding,
            args=["--locked"],
        ),
    ],
    cmdclass={"build_rust": BuildRust, "bdist_wheel": BdistWheel},
)

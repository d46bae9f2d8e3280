"""Tests of the installed `ckalloc` package (run from a virtual environment
the wheel was installed into: `python -m unittest discover -s python/tests`).
Standard library only."""

import glob
import json
import os
import subprocess
import sys
import tempfile
import unittest

import ckalloc

ALLOCATE = "b = bytearray(64 << 20); b[-1] = 1"


def ckalloc_run(code, env=None, module=False):
    """`ckalloc run -- python -c CODE` (or `python -m ckalloc run -- ...`):
    the finished process, output captured, with the CKALLOC_* variables of
    this process removed and `env` added."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CKALLOC_")}
    base.pop("LD_PRELOAD", None)
    base.update(env or {})
    head = [sys.executable, "-m", "ckalloc"] if module else [os.path.join(os.path.dirname(sys.executable), "ckalloc")]
    return subprocess.run(head + ["run", "--", sys.executable, "-c", code],
                          env=base, capture_output=True, text=True, timeout=120)


class WithoutTheLibrary(unittest.TestCase):
    def test_library_path_names_the_installed_elf_file(self):
        path = ckalloc.library_path()
        self.assertTrue(os.path.isabs(path), path)
        self.assertTrue(path.endswith("/ckalloc/lib/libckalloc_preload.so"), path)
        with open(path, "rb") as f:
            self.assertEqual(f.read(4), b"\x7fELF")

    def test_this_process_is_not_active_and_stats_says_why(self):
        self.assertFalse(ckalloc.is_active())
        with self.assertRaises(ckalloc.NotActiveError) as e:
            ckalloc.stats()
        self.assertIn("ckalloc run", str(e.exception))


    def test_a_copy_loaded_with_ctypes_serves_no_malloc_and_is_not_active(self):
        code = "import ckalloc, ctypes, os; " \
               "ctypes.CDLL(ckalloc.library_path(), os.RTLD_GLOBAL); print(ckalloc.is_active())"
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stdout), (0, "False\n"), p.stderr)

    def test_behind_another_allocator_it_is_not_active(self):
        jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
        if not os.path.exists(jemalloc):
            self.skipTest(f"no {jemalloc} (Debian's libjemalloc2)")
        env = dict(os.environ, LD_PRELOAD=f"{jemalloc} {ckalloc.library_path()}")
        code = "import ckalloc\nprint(ckalloc.is_active())\ntry: ckalloc.stats()\n" \
               "except ckalloc.NotActiveError as e: print(e)"
        p = subprocess.run([sys.executable, "-c", code],
                           env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith("False\n"), p.stdout)
        self.assertIn(f"goes first to {jemalloc}, loaded ahead of it", p.stdout)

    def test_a_python_built_without_pie_is_active_under_the_library(self):
        # Debian's python3 is built without PIE and takes malloc's and
        # free's addresses: the process's `malloc` is its own PLT entry.
        python = "/usr/bin/python3"
        if not os.path.exists(python):
            self.skipTest(f"no {python}")
        with open(os.path.realpath(python), "rb") as f:
            if f.read(18)[16] != 2:  # e_type ET_EXEC: built without PIE
                self.skipTest(f"{python} is built with PIE")
        package = os.path.dirname(os.path.dirname(os.path.abspath(ckalloc.__file__)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CKALLOC_")}
        env.update(LD_PRELOAD=ckalloc.library_path(), PYTHONPATH=package, PYTHONNOUSERSITE="1")
        code = ALLOCATE + "; import ckalloc; print(ckalloc.is_active(), " \
            "ckalloc.stats()['preload']['blocks'] >= 1)"
        p = subprocess.run([python, "-c", code], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stdout), (0, "True True\n"), p.stderr)


class UnderCkallocRun(unittest.TestCase):
    def test_stats_reads_the_preloaded_library(self):
        code = ALLOCATE + "; import ckalloc, json; print(json.dumps([ckalloc.is_active(), ckalloc.stats()]))"
        for module in (False, True):
            p = ckalloc_run(code, module=module)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stderr, "")
            active, stats = json.loads(p.stdout)
            self.assertTrue(active)
            self.assertGreaterEqual(stats["preload"]["blocks"], 1, stats)
            self.assertGreaterEqual(stats["preload"]["bytes"], 64 << 20, stats)
            self.assertEqual(set(stats["tiers"]), {"hugetlb", "thp", "normal"})
            self.assertEqual(stats["settings"]["CKALLOC_SHOW_STATS"]["source"], "default")
            self.assertIsNone(stats["stats_file"])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, 'ck "%p".txt')
            p = ckalloc_run(code, {"CKALLOC_STATS_FILE": path})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(json.loads(p.stdout)[1]["stats_file"], path)

    def test_the_command_runs_with_its_output_streams_closed(self):
        head = os.path.join(os.path.dirname(sys.executable), "ckalloc")
        for closed in ("1", "2"):
            p = subprocess.run(["sh", "-c", f'"$0" run -- "$1" -c "raise SystemExit(5)" {closed}>&-',
                                head, sys.executable], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 5, p.stderr)
            self.assertNotIn("Traceback", p.stderr)

    def test_the_program_status_is_kept(self):
        self.assertEqual(ckalloc_run("raise SystemExit(7)").returncode, 7)
        self.assertEqual(ckalloc_run("raise SystemExit(3)", module=True).returncode, 3)

    def test_a_summary_only_from_a_process_with_huge_blocks(self):
        p = ckalloc_run("print('small')", {"CKALLOC_SHOW_STATS": "1"})
        self.assertEqual((p.stdout, p.stderr), ("small\n", ""))
        p = ckalloc_run(ALLOCATE + "; print('big')", {"CKALLOC_SHOW_STATS": "1"})
        self.assertEqual(p.stdout, "big\n")
        self.assertIn("huge block", p.stderr)
        self.assertEqual(p.stderr.count(": preload: "), 1, p.stderr)

    def test_summaries_go_to_a_file_per_process_and_never_into_the_streams(self):
        child = f"import subprocess, sys; {ALLOCATE}; " \
                f"subprocess.run([sys.executable, '-c', {ALLOCATE!r}], check=True); print('done')"
        with tempfile.TemporaryDirectory() as d:
            p = ckalloc_run(child, {"CKALLOC_STATS_FILE": os.path.join(d, "ck.%p.txt")})
            self.assertEqual((p.returncode, p.stdout, p.stderr), (0, "done\n", ""))
            files = sorted(glob.glob(os.path.join(d, "ck.*.txt")))
            self.assertEqual(len(files), 2, files)
            for f in files:
                pid = f.split(".")[-2]
                with open(f) as fh:
                    text = fh.read()
                self.assertTrue(text.startswith(f"ckalloc[{pid}]: preload: 1 huge block"), text)

    def test_settings_not_taken_are_named_before_the_program_starts(self):
        p = ckalloc_run("print('ran')", {"CKALLOC_THP": "nope", "CKALLOC_PRELOAD_THRESHOLD": "16eib"})
        self.assertEqual(p.stdout, "ran\n")
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 2, p.stderr)
        self.assertTrue(all(l.startswith("ckalloc run: warning: ") for l in lines), p.stderr)
        self.assertIn('CKALLOC_THP="nope"', p.stderr)
        self.assertIn("taken as unset (default on)", p.stderr)
        self.assertIn('CKALLOC_PRELOAD_THRESHOLD="16eib"', p.stderr)


if __name__ == "__main__":
    unittest.main()

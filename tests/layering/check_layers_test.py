#!/usr/bin/env python3
"""Tests check_layers.py on small trees of its own making:

- an include the layering forbids is reported, and the check fails;
- a build tree is never listed. Other tests create and delete virtual
  environments under build/ while the check runs, and a check that listed
  them failed when a folder vanished under it. Here the build tree holds a
  folder whose path is longer than the system allows, so listing it fails
  every time, as a vanishing folder does some of the time.

usage: check_layers_test.py (no arguments).
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

CHECK = pathlib.Path(__file__).with_name("check_layers.py")


def write(root, relative, text):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def deep_folder(top, length):
    """Makes folders under top until the path is longer than length, one
    folder at a time relative to the last (the whole path is too long for
    any one call)."""
    handle = os.open(top, os.O_RDONLY)
    made = len(str(top))
    try:
        while made <= length:
            name = "d" * 200
            os.mkdir(name, dir_fd=handle)
            inner = os.open(name, os.O_RDONLY, dir_fd=handle)
            os.close(handle)
            handle = inner
            made += len(name) + 1
    finally:
        os.close(handle)


class CheckLayersTest(unittest.TestCase):
    def setUp(self):
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="layers_"))
        write(self.root, "lib/attn/ops.h", '#include "attn/tensor.h"\n')
        write(self.root, "server/execution/batcher.h",
              '#include "absl/status/status.h"\n')

    def tearDown(self):
        shutil.rmtree(self.root)

    def check(self):
        return subprocess.run([sys.executable, str(CHECK), str(self.root)],
                              capture_output=True, text=True)

    def test_a_clean_tree_passes(self):
        result = self.check()
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("0 layering violations", result.stdout)

    def test_a_forbidden_include_fails_naming_its_line(self):
        write(self.root, "lib/attn/bad.h",
              '#pragma once\n#include <grpcpp/grpcpp.h>\n')
        result = self.check()
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("lib/attn/bad.h:2: #include grpcpp/grpcpp.h", result.stdout)

    def test_a_build_tree_is_never_listed(self):
        # Sources under build/ are generated or installed, not ours: a
        # forbidden include there is not a violation, and a folder there
        # that cannot be listed does not break the check.
        write(self.root, "build/lib/generated.h", "#include <grpcpp/grpcpp.h>\n")
        write(self.root, "lib/build-asan/generated.h",
              "#include <grpcpp/grpcpp.h>\n")
        deep_folder(self.root / "build", os.pathconf("/", "PC_PATH_MAX") + 100)
        result = self.check()
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("0 layering violations", result.stdout)


if __name__ == "__main__":
    unittest.main()

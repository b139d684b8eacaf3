#!/usr/bin/env python3
"""The folder-dependency checker (check_folder_deps.py) on small made-up trees: it
passes a tree that keeps its table, and names the file and folders of an include the
table does not allow, a cycle in the table, a folder without a row, a row without
sources and a folder over its size."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_folder_deps as checker  # noqa: E402


def make_tree(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as fh:
            fh.write(text)


class CheckFolderDepsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name
        make_tree(self.root, {
            "common/a.h": "#pragma once\n",
            "common/a.cc": '#include "common/a.h"\n#include "pipetrain/v1/job.pb.h"\n',
            "stage_server/link/l.h": '#include "common/a.h"\n',
            "stage_server/exec/e.cc": '#include "stage_server/link/l.h"\n#include <vector>\n'
                                      '#include "absl/status/status.h"\n',
        })
        self.table = {
            "proto": set(),
            "common": {"proto"},
            "stage_server/link": {"common"},
            "stage_server/exec": {"stage_server/link"},
        }

    def tearDown(self):
        self.dir.cleanup()

    def test_a_tree_that_keeps_its_table_passes(self):
        failures, counts = checker.check(self.root, self.table)
        self.assertEqual(failures, [])
        self.assertEqual(counts["stage_server/exec"], 1)

    def test_an_include_the_table_does_not_allow_is_named(self):
        make_tree(self.root, {"stage_server/link/bad.cc": '#include "stage_server/exec/e.cc"\n'})
        failures, _ = checker.check(self.root, self.table)
        self.assertEqual(len(failures), 1)
        self.assertIn("stage_server/link/bad.cc includes stage_server/exec/e.cc", failures[0])
        self.assertIn("stage_server/link/ may not depend on stage_server/exec/", failures[0])

    def test_a_cycle_in_the_table_is_refused(self):
        self.table["stage_server/link"].add("stage_server/exec")
        failures, _ = checker.check(self.root, self.table)
        self.assertTrue(any("cycle" in f and "stage_server/exec -> stage_server/link" in f
                            for f in failures), failures)

    def test_a_folder_without_a_row_and_a_row_without_sources_are_named(self):
        make_tree(self.root, {"client/c.cc": "int x;\n"})
        self.table["coordinator/jobs"] = {"common"}
        failures, _ = checker.check(self.root, self.table)
        self.assertTrue(any("client/c.cc: its folder client/ has no row" in f for f in failures))
        self.assertTrue(any("names coordinator/jobs/, which holds no source" in f
                            for f in failures))

    def test_folders_over_their_size_are_named(self):
        make_tree(self.root, {f"stage_server/s{i}.cc": "" for i in range(13)})
        make_tree(self.root, {f"stage_server/link/x{i}.h": "" for i in range(16)})
        self.table["stage_server"] = set()
        failures, _ = checker.check(self.root, self.table)
        self.assertIn("stage_server/ holds 13 source files, more than 12", failures)
        self.assertIn("stage_server/link/ holds 17 source files, more than 16", failures)

    def test_the_table_is_read_from_its_fenced_block(self):
        doc = os.path.join(self.root, "map.md")
        with open(doc, "w", encoding="utf-8") as fh:
            fh.write("text\n```folders\n# a comment\nproto:\ncommon: proto  # why\n```\n")
        self.assertEqual(checker.read_table(doc), {"proto": set(), "common": {"proto"}})


if __name__ == "__main__":
    unittest.main()

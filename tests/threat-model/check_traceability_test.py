#!/usr/bin/env python3
"""Tests of threat-model/check_traceability.py: the real table passes; each kind of rot fails."""
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "threat-model" / "check_traceability.py"

DOC = "# model\nT-X-1 and T-X-2.\n"
HEADER = "id,threat,attacker,property,mitigation,evidence\n"
ROW1 = 'T-X-1,"a threat",A1,P1,"src/a.cc::Table::Grant","gtest:ATest.Works; fuzz:page_ops"\n'
ROW2 = 'T-X-2,"another",A2,P2,"src/a.cc::Grant","planted:no_epoch_pin; pytest:tests/t.py::test_ok"\n'


def run(root):
    return subprocess.run([sys.executable, str(CHECKER), "--root", str(root)],
                          capture_output=True, text=True)


class CheckTraceabilityTest(unittest.TestCase):
    def setUp(self):
        self.root = Path(tempfile.mkdtemp(prefix="traceability-"))
        for d in ("threat-model", "src", "tests", "fuzz", "scripts"):
            (self.root / d).mkdir()
        (self.root / "src" / "a.cc").write_text("class Table { void Grant(); };\n")
        (self.root / "tests" / "a_test.cc").write_text("TEST(ATest, Works) {}\n")
        (self.root / "tests" / "t.py").write_text("def test_ok():\n    pass\n")
        (self.root / "fuzz" / "page_ops_fuzzer.cc").write_text("// target\n")
        (self.root / "fuzz" / "CMakeLists.txt").write_text(
            "set(KVGUARD_PLANTED_BUGS\n    no_epoch_pin)\nkvguard_fuzz_target(page_ops x)\n")
        (self.root / "scripts" / "fuzz-campaign").write_text(
            'PLANTED = {\n    "no_epoch_pin": {"x"},\n}\n')
        (self.root / "threat-model" / "THREAT_MODEL.md").write_text(DOC)
        self.write(ROW1 + ROW2)

    def tearDown(self):
        shutil.rmtree(self.root)

    def write(self, rows):
        (self.root / "threat-model" / "traceability.csv").write_text(HEADER + rows)

    def assertFailsNaming(self, text):
        r = run(self.root)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(text, r.stderr)

    def test_the_repository_table_passes(self):
        r = run(ROOT)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("0 problems", r.stdout)

    def test_a_complete_table_passes(self):  # the positive twin of every case below
        r = run(self.root)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_a_removed_test_fails(self):
        (self.root / "tests" / "a_test.cc").write_text("TEST(ATest, Renamed) {}\n")
        self.assertFailsNaming("test ATest.Works does not exist")

    def test_a_removed_symbol_fails(self):
        (self.root / "src" / "a.cc").write_text("class Table { void Allot(); };\n")
        self.assertFailsNaming("symbol Grant is not in src/a.cc")

    def test_a_removed_file_fails(self):
        (self.root / "src" / "a.cc").unlink()
        self.assertFailsNaming("mitigation file src/a.cc does not exist")

    def test_a_removed_fuzz_target_fails(self):
        (self.root / "fuzz" / "page_ops_fuzzer.cc").unlink()
        self.assertFailsNaming("fuzz target page_ops does not exist")

    def test_a_removed_planted_bug_fails(self):
        (self.root / "scripts" / "fuzz-campaign").write_text("PLANTED = {}\n")
        self.assertFailsNaming("planted bug no_epoch_pin does not exist")

    def test_a_removed_pytest_fails(self):
        (self.root / "tests" / "t.py").write_text("def test_other():\n    pass\n")
        self.assertFailsNaming("pytest tests/t.py::test_ok does not exist")

    def test_a_threat_without_evidence_fails(self):
        self.write(ROW1 + 'T-X-2,"another",A2,P2,"src/a.cc::Grant",""\n')
        self.assertFailsNaming("T-X-2: no evidence")

    def test_a_repeated_id_fails(self):
        self.write(ROW1 + ROW1.replace('"a threat"', '"the same id again"'))
        self.assertFailsNaming("T-X-1: id repeated")

    def test_an_unknown_evidence_kind_fails(self):
        self.write(ROW1 + ROW2.replace("planted:no_epoch_pin", "hope:it_works"))
        self.assertFailsNaming("evidence 'hope:it_works' is not one of")

    def test_a_bad_attacker_or_property_fails(self):
        self.write(ROW1 + ROW2.replace(",A2,P2,", ",A9,P8,"))
        self.assertFailsNaming("attacker A9 is not one of A1..A7")
        self.assertFailsNaming("property P8 is not one of P1..P7")

    def test_a_row_the_doc_never_names_fails(self):
        (self.root / "threat-model" / "THREAT_MODEL.md").write_text("# model\nT-X-1 only.\n")
        self.assertFailsNaming("T-X-2: in traceability.csv, never named in THREAT_MODEL.md")

    def test_doc_and_table_must_name_the_same_threats(self):
        (self.root / "threat-model" / "THREAT_MODEL.md").write_text(DOC + "And T-X-3.\n")
        self.assertFailsNaming("T-X-3: named in THREAT_MODEL.md, missing from traceability.csv")


if __name__ == "__main__":
    unittest.main()

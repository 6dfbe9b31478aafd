#!/usr/bin/env python3
"""threat-model/check_traceability.py: keeps threat-model/traceability.csv honest (CI runs it).

Every row is a threat -> its mitigations -> its evidence. Fails (exit 1, naming each problem)
when:
  * a mitigation's file does not exist, or its symbol (`path::Name` or `path::Class::Name`:
    every `::` part must appear in the file as a word) does not;
  * an evidence item names something that does not exist:
      gtest:Suite.Name            a TEST / TEST_F / TEST_P (Suite, Name) under tests/
      pytest:path.py::test_name   a `def test_name(` in that file
      fuzz:name                   fuzz/<name>_fuzzer.cc, declared in fuzz/CMakeLists.txt
      planted:bug                 a planted bug of fuzz/CMakeLists.txt and scripts/fuzz-campaign
      regression:path             a saved reproducer file
  * a threat has no evidence, an id repeats, a row has extra fields, an attacker is not one of
    A1..A7 or a property not one of P1..P7 (THREAT_MODEL.md sections 1 and 3), or
    THREAT_MODEL.md and the table disagree on which threat ids exist.
  python3 threat-model/check_traceability.py [--root DIR]
"""
import argparse
import csv
import re
import sys
from pathlib import Path

KINDS = ("gtest", "pytest", "fuzz", "planted", "regression")


def gtest_names(root):
    names = set()
    pattern = re.compile(r"^\s*TEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\)", re.M)
    for f in (root / "tests").rglob("*.cc"):
        for suite, name in pattern.findall(f.read_text(errors="replace")):
            names.add(f"{suite}.{name}")
    return names


def planted_bugs(root):
    cmake = (root / "fuzz" / "CMakeLists.txt").read_text()
    m = re.search(r"set\(KVGUARD_PLANTED_BUGS\s+([^)]*)\)", cmake)
    in_cmake = set(m.group(1).split()) if m else set()
    script = (root / "scripts" / "fuzz-campaign").read_text()
    in_script = set(re.findall(r'^\s*"(\w+)": \{', script, re.M))
    return in_cmake & in_script


def check(root):
    problems = []
    table = root / "threat-model" / "traceability.csv"
    doc = (root / "threat-model" / "THREAT_MODEL.md").read_text()
    gtests = gtest_names(root)
    planted = planted_bugs(root)
    fuzz_cmake = (root / "fuzz" / "CMakeLists.txt").read_text()
    ids = []
    with table.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        problems.append("traceability.csv has no threats")
    for row in rows:
        tid = (row.get("id") or "").strip()
        where = f"{tid or '(no id)'}"
        ids.append(tid)
        for field in ("id", "threat", "attacker", "property", "mitigation", "evidence"):
            if not (row.get(field) or "").strip():
                problems.append(f"{where}: empty {field}")
        if row.get(None):
            problems.append(f"{where}: extra fields {row[None]} (quote fields with commas)")
        for a in filter(None, (x.strip() for x in (row.get("attacker") or "").split(";"))):
            if not re.fullmatch(r"A[1-7]", a):
                problems.append(f"{where}: attacker {a} is not one of A1..A7")
        for prop in filter(None, (x.strip() for x in (row.get("property") or "").split(";"))):
            if not re.fullmatch(r"P[1-7]", prop):
                problems.append(f"{where}: property {prop} is not one of P1..P7")
        for item in filter(None, (x.strip() for x in (row.get("mitigation") or "").split(";"))):
            path, _, symbol = item.partition("::")
            file = root / path
            if not file.is_file():
                problems.append(f"{where}: mitigation file {path} does not exist")
                continue
            text = file.read_text(errors="replace")
            for part in filter(None, symbol.split("::")):
                if not re.search(rf"\b{re.escape(part)}\b", text):
                    problems.append(f"{where}: symbol {part} is not in {path}")
            if not symbol:
                problems.append(f"{where}: mitigation {item} names no symbol (path::Symbol)")
        evidence = [x.strip() for x in (row.get("evidence") or "").split(";") if x.strip()]
        if not evidence:
            problems.append(f"{where}: no evidence")
        for item in evidence:
            kind, _, name = item.partition(":")
            if kind not in KINDS or not name:
                problems.append(f"{where}: evidence '{item}' is not one of {KINDS} as kind:name")
            elif kind == "gtest" and name not in gtests:
                problems.append(f"{where}: test {name} does not exist under tests/")
            elif kind == "pytest":
                path, _, func = name.partition("::")
                f = root / path
                if not f.is_file() or not re.search(rf"^def {re.escape(func)}\(",
                                                    f.read_text(errors="replace"), re.M):
                    problems.append(f"{where}: pytest {name} does not exist")
            elif kind == "fuzz" and (not (root / "fuzz" / f"{name}_fuzzer.cc").is_file() or
                                     f"kvguard_fuzz_target({name} " not in fuzz_cmake):
                problems.append(f"{where}: fuzz target {name} does not exist")
            elif kind == "planted" and name not in planted:
                problems.append(f"{where}: planted bug {name} does not exist")
            elif kind == "regression" and not (root / name).is_file():
                problems.append(f"{where}: reproducer {name} does not exist")
    seen = set()
    for tid in ids:
        if tid in seen:
            problems.append(f"{tid}: id repeated")
        seen.add(tid)
    in_doc = set(re.findall(r"\bT-[A-Z0-9]+-\d+\b", doc))
    for tid in sorted(in_doc - seen):
        problems.append(f"{tid}: named in THREAT_MODEL.md, missing from traceability.csv")
    for tid in sorted(seen - in_doc):
        problems.append(f"{tid}: in traceability.csv, never named in THREAT_MODEL.md")
    return rows, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    args = ap.parse_args()
    rows, problems = check(Path(args.root))
    for p in problems:
        print(f"traceability: {p}", file=sys.stderr)
    evidence = sum(len([x for x in r["evidence"].split(";") if x.strip()]) for r in rows)
    print(f"traceability: {len(rows)} threats, {evidence} pieces of evidence, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""symbols.py — libcgtree.so exports exactly the public API, nothing else.

Usage: symbols.py LIBCGTREE_SO HEADER...

Checks, and fails with a list of offenders:
  1. every defined dynamic symbol of the shared library starts with cgt_
     (internal helpers such as pool_free must not be able to clash with a
     host program's own symbols);
  2. every function declared in the public headers carries CGT_API (so a
     function added without it cannot silently go missing from the .so);
  3. every such function is exported, and nothing cgt_ is exported that no
     header declares;
  4. the soname is libcgtree.so.0 (the ABI policy of docs/api.md).
Exits 77 (skipped) where nm is not installed.
"""
import re
import shutil
import subprocess
import sys


def declared_functions(path):
    """(name, has_CGT_API) for each function declared at file scope."""
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)  # comments
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", " ", text, flags=re.M)  # preprocessor lines
    found = []
    # A declaration starts a line: [CGT_API] return-type name(
    decl = re.compile(r"^(?!typedef)(static\s+inline\s+)?(CGT_API\s+)?(?:const\s+)?[A-Za-z_]\w*[\s*]+(cgt_\w+)\s*\(", re.M)
    for m in decl.finditer(text):
        if m.group(1):  # static inline helpers live in the header, not the library
            continue
        found.append((m.group(3), bool(m.group(2))))
    return found


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    lib, headers = sys.argv[1], sys.argv[2:]
    if not shutil.which("nm"):
        print("nm not found: skipped")
        return 77
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    exported = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            exported.add(parts[2].split("@")[0])
    bad = 0

    foreign = sorted(s for s in exported if not s.startswith("cgt_"))
    if foreign:
        print(f"exported names that are not cgt_*: {' '.join(foreign)}")
        bad += 1

    declared = {}
    for h in headers:
        for name, has_api in declared_functions(h):
            declared[name] = has_api
    if len(declared) < 30:
        print(f"found only {len(declared)} declarations in {headers}: the parser is broken")
        bad += 1
    unmarked = sorted(n for n, api in declared.items() if not api)
    if unmarked:
        print(f"declared without CGT_API: {' '.join(unmarked)}")
        bad += 1
    missing = sorted(n for n in declared if n not in exported)
    if missing:
        print(f"declared but not exported: {' '.join(missing)}")
        bad += 1
    undeclared = sorted(s for s in exported if s.startswith("cgt_") and s not in declared)
    if undeclared:
        print(f"exported but declared in no public header: {' '.join(undeclared)}")
        bad += 1

    if shutil.which("readelf"):
        dyn = subprocess.run(["readelf", "-d", lib], check=True, capture_output=True, text=True).stdout
        m = re.search(r"\(SONAME\).*\[(.*)\]", dyn)
        soname = m.group(1) if m else None
        if soname != "libcgtree.so.0":
            print(f"soname is {soname}, expected libcgtree.so.0 (docs/api.md, Versions and ABI)")
            bad += 1

    print(f"{len(exported)} exported symbols, {len(declared)} public functions declared")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# check_output.sh PROGRAM EXPECTED — run PROGRAM; pass if it exits 0 and its
# standard output is exactly the contents of EXPECTED (a diff otherwise). A
# program that exits 77 (it cannot run here, e.g. no GPU) is skipped: 77 too.
set -u
prog=$1 expected=$2
actual=$("$prog")
rc=$?
if [ $rc -eq 77 ]; then
  echo "$actual"
  exit 77
fi
[ $rc -eq 0 ] || { echo "$prog exited $rc"; echo "$actual"; exit 1; }
if ! diff -u "$expected" <(printf '%s\n' "$actual"); then
  echo "output of $prog differs from $expected"
  exit 1
fi
printf '%s\n' "$actual"

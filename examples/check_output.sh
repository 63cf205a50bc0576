#!/usr/bin/env bash
# check_output.sh PROGRAM EXPECTED — run PROGRAM; pass if it exits 0 and its
# standard output is exactly the contents of EXPECTED (a diff otherwise).
set -u
prog=$1 expected=$2
actual=$("$prog") || { echo "$prog exited $?"; echo "$actual"; exit 1; }
if ! diff -u "$expected" <(printf '%s\n' "$actual"); then
  echo "output of $prog differs from $expected"
  exit 1
fi
printf '%s\n' "$actual"

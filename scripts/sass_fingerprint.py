#!/usr/bin/env python3
# scripts/sass_fingerprint.py — per-kernel fingerprint of a CUDA object's SASS (and, from a
# build log, its ptxas -v resource lines), to check that a source refactor leaves the
# generated code where it was (the Hopper forward's speed moved 15% with one divergent
# branch: hopper/TUNING.md).
#
#   sass_fingerprint.py OBJ.o [--ptxas BUILD.log] > fingerprint.tsv
#   sass_fingerprint.py --compare before.tsv after.tsv     (exit 1 if any kernel differs)
#
# Per kernel (mangled name): total instructions; the counts of UIADD3, IADD3, R2UR, STL,
# LDL, HGMMA, BAR, SYNCS (opcode prefix before the first '.'); a hash of the opcode
# sequence and one of the whole normalised SASS text (addresses and encodings removed,
# registers kept: equal text hashes mean the same instructions on the same registers);
# ptxas -v's registers, stack frame, spill stores and loads when a log is given.
# cuobjdump comes from $CUOBJDUMP, else PATH.
import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys

OPCODES = ["UIADD3", "IADD3", "R2UR", "STL", "LDL", "HGMMA", "BAR", "SYNCS"]
FIELDS = ["total"] + OPCODES + ["opcode_hash", "text_hash", "registers", "stack", "spill_stores", "spill_loads"]

FUNCTION_RE = re.compile(r"^\s*Function : (\S+)")
INSTRUCTION_RE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*(/\*.*\*/)?\s*$")


def cuobjdump_path():
    path = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not path:
        sys.exit("sass_fingerprint: no cuobjdump (set CUOBJDUMP)")
    return path


def sass_by_kernel(object_path):
    text = subprocess.run([cuobjdump_path(), "-sass", object_path], check=True, capture_output=True,
                          text=True).stdout
    kernels, current = {}, None
    for line in text.splitlines():
        match = FUNCTION_RE.match(line)
        if match:
            current = match.group(1)
            kernels[current] = []
            continue
        if current is None:
            continue
        match = INSTRUCTION_RE.match(line)
        if match and match.group(1):
            kernels[current].append(match.group(1).rstrip(" ;"))
    return kernels


def opcode_of(instruction):
    # "@!P0 BRA `(.L_x_1)" -> "BRA"; "UIADD3 UR4, ..." -> "UIADD3"
    words = instruction.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def ptxas_resources(log_path):
    # ptxas -v: "Function properties for NAME" then "N bytes stack frame, N bytes spill
    # stores, N bytes spill loads", later "Compiling entry function 'NAME'" ... "Used N registers".
    resources, current = {}, None
    with open(log_path, errors="replace") as log:
        for line in log:
            match = re.search(r"Compiling entry function '(\S+)'", line) or re.search(
                r"Function properties for (\S+)", line)
            if match:
                current = match.group(1)
                resources.setdefault(current, {})
            match = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if match and current:
                resources[current].update(stack=match.group(1), spill_stores=match.group(2),
                                          spill_loads=match.group(3))
            match = re.search(r"Used (\d+) registers", line)
            if match and current:
                resources[current]["registers"] = match.group(1)
    return resources


def fingerprint(object_path, log_path):
    resources = ptxas_resources(log_path) if log_path else {}
    rows = []
    for kernel, instructions in sorted(sass_by_kernel(object_path).items()):
        opcodes = [opcode_of(i) for i in instructions]
        counts = {name: sum(1 for op in opcodes if op.split(".")[0] == name) for name in OPCODES}
        row = {"total": len(instructions), **counts,
               "opcode_hash": hashlib.sha1(" ".join(opcodes).encode()).hexdigest()[:12],
               "text_hash": hashlib.sha1("\n".join(instructions).encode()).hexdigest()[:12]}
        for key in ("registers", "stack", "spill_stores", "spill_loads"):
            row[key] = resources.get(kernel, {}).get(key, "-")
        rows.append((kernel, row))
    return rows


def read_table(path):
    table = {}
    with open(path) as lines:
        header = next(lines).rstrip("\n").split("\t")
        for line in lines:
            values = line.rstrip("\n").split("\t")
            table[values[0]] = dict(zip(header[1:], values[1:]))
    return table


def compare(before_path, after_path):
    before, after = read_table(before_path), read_table(after_path)
    differing = 0
    for kernel in sorted(set(before) | set(after)):
        if kernel not in before or kernel not in after:
            print(f"only in {'after' if kernel in after else 'before'}: {kernel}")
            differing += 1
            continue
        changes = [f"{key} {before[kernel][key]} -> {after[kernel][key]}" for key in FIELDS
                   if before[kernel].get(key) != after[kernel].get(key)]
        status = "identical" if not changes else "; ".join(changes)
        if changes:
            differing += 1
        print(f"{status}\t{kernel}")
    print(f"{len(set(before) | set(after))} kernels, {differing} differ")
    return 1 if differing else 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("object", nargs="?")
    parser.add_argument("--ptxas", help="build log with the object's ptxas -v lines")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    if not args.object:
        parser.error("an object file or --compare")
    print("\t".join(["kernel"] + FIELDS))
    for kernel, row in fingerprint(args.object, args.ptxas):
        print("\t".join([kernel] + [str(row[key]) for key in FIELDS]))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Maps an ncu per-SASS stall export (bench/gpu/ncu_source.sh's CSV) onto source lines and roles.

The profile's addresses are absolute; offset = address - the first row's. The same kernel built
here (a Release object with -lineinfo, src/cuda/CMakeLists.txt's default) has the same SASS when
the code is the same: this script checks that (instruction count, then each instruction's text
without `.reuse` flags and absolute branch targets) and stops on a mismatch, so a profile is
never read against other code. nvdisasm's inline chains (-gi) then give each instruction its
source lines, innermost first; a role is picked by the outermost line in --file (the kernel's
role branches), a phase by the innermost line in --file, or by SASS offset range
(--address-phases: inside a wgmma loop the line table tags rematerialised descriptor arithmetic
and HGMMAs with the descriptors' definition lines, so cut the loop at its landmarks instead:
the try-waits, HGMMA groups, WARPGROUP.DEPBAR, BAR.SYNC/ARV, the fences).

    python3 bench/gpu/ncu_source_lines.py PROFILE.csv OBJECT.o --function NAME_PART \
        [--file kernel.cuh] [--roles 'producer:377-634,consumer:635-1240'] \
        [--phases 'full wait:746-746,...' | --address-phases 'full wait:0x47d0-0x489f,...'] \
        [--top 30] [--tools DIR]

NAME_PART picks the kernel among the object's functions (a piece of its mangled name, e.g.
`Li128ELi64ELi128ELi2ELb0ELNS1_16BackwardScheduleE1EE`). Output: the role table (share of all
samples, largest stall reasons; a reason ncu does not export is shown as `unexported`), the
phase table if --phases is given (share of all and of the roles named consumer*), the lines
with the most samples, and the top instructions with their inline chains. Samples are per warp:
a waiting producer lane is idle time, not a bottleneck; a warp blocked at a named barrier is
sampled on the instruction after BAR.SYNC.
"""
import argparse
import collections
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile


def tool(name, tools_dir):
    for candidate in ([os.path.join(tools_dir, name)] if tools_dir else []) + [
            shutil.which(name) or "", os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", name)]:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    sys.exit(f"{name} not found (--tools DIR, PATH or CUDA_HOME)")


def read_profile(path):
    with open(path, newline="") as f:
        lines = [line for line in f if line.strip() and not line.startswith("==")]
    header = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), 0)
    rows = list(csv.DictReader(lines[header:]))
    total = next(c for c in rows[0] if "Sampling (All" in c)
    reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    base = int(rows[0]["Address"], 16)
    out = []
    for row in rows:
        samples = int(float(row[total] or 0))
        by_reason = {c[len("stall_"):]: int(float(row[c] or 0)) for c in reasons}
        unexported = samples - sum(by_reason.values())
        if unexported > 0:
            by_reason["unexported"] = unexported
        out.append({"offset": int(row["Address"], 16) - base, "sass": row["Source"].strip(), "samples": samples,
                    "reasons": by_reason, "executed": int(float(row.get("Instructions Executed") or 0))})
    return out


def disassemble(object_path, function_part, tools_dir):
    """offset -> (instruction text, [(file, line), ...] innermost first) of the one matching function."""
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([tool("cuobjdump", tools_dir), "-xelf", "all", os.path.abspath(object_path)], cwd=work,
                       check=True, stdout=subprocess.DEVNULL)
        cubins = [os.path.join(work, f) for f in os.listdir(work) if f.endswith(".cubin")]
        text = "".join(subprocess.run([tool("nvdisasm", tools_dir), "-c", "-gi", c], check=True, capture_output=True,
                                      text=True).stdout for c in cubins)
    functions = {}
    current, chain, fresh = None, [], False
    for line in text.splitlines():
        if line.startswith("//---------------------"):
            name = line.split(".text.", 1)[-1].split()[0] if ".text." in line else None
            current = functions.setdefault(name, {}) if name and function_part in name else None
            continue
        if current is None:
            continue
        if "//## File" in line:
            if not fresh:
                chain, fresh = [], True
            for m in re.finditer(r'"([^"]+)", line (\d+)', line):
                frame = (os.path.basename(m.group(1)), int(m.group(2)))
                if frame not in chain:
                    chain.append(frame)
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            fresh = False
            current[int(m.group(1), 16)] = (m.group(2), list(chain))
    if len(functions) != 1:
        sys.exit(f"--function {function_part!r} matches {len(functions)} functions: {sorted(functions)[:5]}")
    return next(iter(functions.values()))


def same_instruction(a, b):
    """Equal up to `.reuse` flags, absolute addresses (branch targets) and separators."""
    def norm(text):
        text = re.sub(r"`\([^)]*\)|0x[0-9a-f]+", "X", text.replace(".reuse", ""))  # nvdisasm labels and symbols, ncu addresses
        return " ".join(text.replace(",", " ").split())
    return norm(a) == norm(b)


def ranges(spec):
    out = []
    for item in filter(None, (spec or "").split(",")):
        name, span = item.rsplit(":", 1)
        low, high = (int(x, 0) for x in span.split("-"))
        out.append((name.strip(), low, high))
    return out


def pick(named_ranges, line):
    return next((name for name, low, high in named_ranges if line is not None and low <= line <= high), None)


def reasons_text(counter, total, count=3):
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in counter.most_common(count) if v) if total else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("object")
    parser.add_argument("--function", required=True)
    parser.add_argument("--file", default="kernel.cuh")
    parser.add_argument("--roles", default="")
    parser.add_argument("--phases", default="")
    parser.add_argument("--address-phases", default="")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--tools", default="")
    args = parser.parse_args()

    profile = read_profile(args.csv)
    sass = disassemble(args.object, args.function, args.tools)
    if len(sass) != len(profile):
        sys.exit(f"the object's kernel has {len(sass)} instructions, the profile {len(profile)}: other code")
    mismatches = [r["offset"] for r in profile if r["offset"] not in sass or not same_instruction(r["sass"], sass[r["offset"]][0])]
    if mismatches:
        sys.exit(f"{len(mismatches)} instructions differ from the profile's (first at {mismatches[0]:#x}): other code")
    print(f"{len(profile)} instructions, SASS equal to the profile's; {sum(r['samples'] for r in profile)} samples")

    roles, phases, address_phases = ranges(args.roles), ranges(args.phases), ranges(args.address_phases)
    total = sum(r["samples"] for r in profile)
    by_role, by_phase, by_line = (collections.defaultdict(collections.Counter) for _ in range(3))
    role_samples, phase_samples, line_samples = collections.Counter(), collections.Counter(), collections.Counter()
    for r in profile:
        chain = sass[r["offset"]][1]
        lines = [line for f, line in chain if f == args.file]
        r["chain"] = chain
        role = pick(roles, lines[-1] if lines else None) or "other"
        role_samples[role] += r["samples"]
        by_role[role].update(r["reasons"])
        line_key = f"{args.file}:{lines[0]}" + (f" (via {lines[-1]})" if len(lines) > 1 else "") if lines else "?"
        line_samples[line_key] += r["samples"]
        by_line[line_key].update(r["reasons"])
        if (phases or address_phases) and role.startswith("consumer"):
            phase = pick(address_phases, r["offset"]) if address_phases else \
                next((p for p in (pick(phases, line) for line in lines) if p), "other")
            phase = phase or "other"
            phase_samples[phase] += r["samples"]
            by_phase[phase].update(r["reasons"])
    consumer = sum(v for k, v in role_samples.items() if k.startswith("consumer")) or 1
    print("\n| role | all | reasons |\n|---|---|---|")
    for role, v in role_samples.most_common():
        print(f"| {role} | {100 * v / total:.1f}% | {reasons_text(by_role[role], v)} |")
    if phases or address_phases:
        print("\n| consumer phase | all | consumer | reasons |\n|---|---|---|---|")
        for phase, v in phase_samples.most_common():
            print(f"| {phase} | {100 * v / total:.1f}% | {100 * v / consumer:.1f}% | {reasons_text(by_phase[phase], v)} |")
    print(f"\n| {args.file} line | all | reasons |\n|---|---|---|")
    for key, v in line_samples.most_common(args.top):
        print(f"| {key} | {100 * v / total:.1f}% | {reasons_text(by_line[key], v)} |")
    print("\n| offset | instruction | all | executed | reasons | inline chain |\n|---|---|---|---|---|---|")
    for r in sorted(profile, key=lambda r: -r["samples"])[:args.top]:
        chain = " < ".join(f"{f}:{line}" for f, line in r["chain"][:4])
        print(f"| {r['offset']:#07x} | `{r['sass'][:56]}` | {100 * r['samples'] / total:.1f}% | {r['executed']} | "
              f"{reasons_text(collections.Counter(r['reasons']), r['samples'], 2)} | {chain} |")


if __name__ == "__main__":
    main()

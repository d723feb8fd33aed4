"""SHA-256 manifest hashing throughput against coreutils ``sha256sum`` on the same files.

Writes ``--files`` files of ``--mb`` MB of random bytes in a temporary folder, reads them once
so both contenders hash from the page cache (this measures hashing, not the disk), then times,
alternating the two so a neighbour's load hits both alike:

* one core: ``sha256sum f1 f2 ...`` (one process) vs ``day0.stages.weights.manifest.hash_files(workers=1)``;
* all cores: one ``sha256sum`` process per core (files dealt round-robin) vs
  ``hash_files(workers=cores)`` (threads; hashlib releases the GIL on large updates).

Prints MB/s per core for each and the ratio day0 / sha256sum (target: at least 0.8); where the
``openssl`` command exists it is timed too, as a stricter reference (coreutils' sha256sum is often
built without OpenSSL and so without the CPU's SHA instructions). Checks the digests agree, and shows the peak memory growth of the Python side (streaming: bounded by
workers x chunk, not by file size). Asserts nothing.

    .venv/bin/python benchmarks/bench_hashing.py [--files 4] [--mb 256] [--repeat 3] [--sweep]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from day0.stages.weights.manifest import CHUNK_BYTES, hash_files  # noqa: E402


def make_files(root: Path, count: int, mb: int) -> list[str]:
    names = []
    block = 8 << 20
    for i in range(count):
        name = f"shard-{i:03d}.bin"
        with open(root / name, "wb") as fh:
            left = mb * 1_000_000
            while left > 0:
                n = min(block, left)
                fh.write(os.urandom(n))
                left -= n
        names.append(name)
    return names


SHA256SUM = ["sha256sum"]
OPENSSL = ["openssl", "dgst", "-sha256", "-r"]  # same output format; the SHA-NI code hashlib also uses


def sha256sum(root: Path, names: list[str], procs: int, cmd: list[str] = SHA256SUM) -> tuple[float, dict[str, str]]:
    """Wall seconds for ``procs`` concurrent processes of ``cmd`` over ``names``, and the digests."""
    groups = [names[i::procs] for i in range(procs) if names[i::procs]]
    t0 = time.perf_counter()
    running = [subprocess.Popen([*cmd, *g], cwd=root, stdout=subprocess.PIPE, text=True) for g in groups]
    outs = [p.communicate()[0] for p in running]
    dt = time.perf_counter() - t0
    digests = {}
    for out in outs:
        for line in out.splitlines():
            digest, name = line.split(maxsplit=1)
            digests[name.lstrip("*")] = digest
    return dt, digests


def day0_hash(root: Path, names: list[str], workers: int, chunk: int = CHUNK_BYTES) -> tuple[float, dict[str, str]]:
    t0 = time.perf_counter()
    got = hash_files(root, names, workers=workers, chunk_bytes=chunk)
    return time.perf_counter() - t0, {k: v.sha256 or "" for k, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--mb", type=int, default=256, help="MB per file")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sweep", action="store_true", help="also time chunk sizes 64 KiB..16 MiB on one core")
    args = ap.parse_args()
    if not shutil.which("sha256sum"):
        sys.exit("sha256sum not found (coreutils); nothing to compare against")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    version = subprocess.run(["sha256sum", "--version"], capture_output=True, text=True).stdout.splitlines()[0]

    with tempfile.TemporaryDirectory(prefix="day0-bench-hash-") as tmp:
        root = Path(tmp)
        names = make_files(root, args.files, args.mb)
        total_mb = args.files * args.mb
        sha256sum(root, names, 1)  # warm the page cache
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        has_openssl = shutil.which("openssl") is not None
        results: dict[str, list[float]] = {k: [] for k in ("sum1", "day1", "sumN", "dayN", "ossl1", "osslN")}
        ref: dict[str, str] = {}
        for _ in range(args.repeat):
            dt, ref = sha256sum(root, names, 1)
            results["sum1"].append(dt)
            dt, mine = day0_hash(root, names, 1)
            results["day1"].append(dt)
            assert mine == ref, "day0 and sha256sum disagree on a digest"
            dt, _ = sha256sum(root, names, cores)
            results["sumN"].append(dt)
            dt, mine = day0_hash(root, names, cores)
            results["dayN"].append(dt)
            assert mine == ref
            if has_openssl:
                dt, theirs = sha256sum(root, names, 1, OPENSSL)
                results["ossl1"].append(dt)
                assert theirs == ref, "openssl and sha256sum disagree on a digest"
                results["osslN"].append(sha256sum(root, names, cores, OPENSSL)[0])
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

        print(f"{args.files} files x {args.mb} MB = {total_mb} MB from page cache; {cores} cores; {version}")
        print(f"load average: {os.getloadavg()[0]:.2f} (shared machine: best of {args.repeat} runs each)")

        def rate(key: str, procs: int) -> float:
            return total_mb / min(results[key]) / procs

        s1, d1, sn, dn = rate("sum1", 1), rate("day1", 1), rate("sumN", cores), rate("dayN", cores)
        print(f"1 core    sha256sum {s1:8.0f} MB/s   day0 {d1:8.0f} MB/s   ratio {d1 / s1:.2f}")
        print(f"{cores} cores   sha256sum {sn:8.0f} MB/s/core   day0 {dn:8.0f} MB/s/core   ratio {dn / sn:.2f}")
        print(f"target ratio >= 0.8 per core -> {'met' if min(d1 / s1, dn / sn) >= 0.8 else 'MISSED'}")
        if has_openssl:
            o1, on = rate("ossl1", 1), rate("osslN", cores)
            print("stricter reference, `openssl dgst -sha256` (SHA-NI where the CPU has it):")
            print(f"1 core    openssl   {o1:8.0f} MB/s   day0 {d1:8.0f} MB/s   ratio {d1 / o1:.2f}")
            print(f"{cores} cores   openssl   {on:8.0f} MB/s/core   day0 {dn:8.0f} MB/s/core   ratio {dn / on:.2f}")
        print(f"digests identical to sha256sum: yes; day0 peak RSS growth while hashing {total_mb} MB: "
              f"{(rss1 - rss0) / 1024:.1f} MB (chunk {CHUNK_BYTES >> 20} MiB x {cores} workers)")

        if args.sweep:
            for chunk in (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20):
                best = min(day0_hash(root, names, 1, chunk)[0] for _ in range(args.repeat))
                print(f"  chunk {chunk >> 10:6d} KiB: {total_mb / best:8.0f} MB/s on one core")


if __name__ == "__main__":
    main()

"""Report speed and size: a run record with 100,000 latency samples and 5 stages must render
in under 2 s into a report under 5 MB.

Also measures, in the same run, the baseline the chart writer was chosen against: matplotlib
(SVG backend) drawing the same charts, import included, in a fresh interpreter. Prints
figures and ratios; asserts nothing (the targets are printed as met / MISSED).

    .venv/bin/python benchmarks/bench_report.py [--samples 100000] [--stages 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support")]

TARGET_S = 2.0
TARGET_BYTES = 5 * 1024 * 1024

MPL_SCRIPT = textwrap.dedent(
    """
    import io, json, sys, time
    t0 = time.perf_counter()
    import matplotlib
    matplotlib.use("svg")
    import matplotlib.pyplot as plt
    t_import = time.perf_counter() - t0
    jobs = json.load(open(sys.argv[1]))
    total = 0
    for job in jobs:
        fig, ax = plt.subplots(figsize=(6.4, 3.0))
        for s in job["series"]:
            if job["kind"] == "bar":
                ax.bar([str(x) for x in s["x"]], s["y"])
            elif job["kind"] == "scatter":
                ax.scatter(s["x"], s["y"], s=4)
            else:
                ax.plot(s["x"], s["y"])
        for r in job.get("reference", []):
            ax.axhline(r["y"], linestyle="--")
        if job.get("x_log"):
            ax.set_xscale("log")
        ax.set_title(job["title"])
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
        plt.close(fig)
        total += len(buf.getvalue())
    print(json.dumps({"import_s": t_import, "total_s": time.perf_counter() - t0, "bytes": total}))
    """
)


def chart_jobs(record) -> list[dict]:
    """The charts the report draws, as plain specs matplotlib can draw too (samples -> CDF + bars)."""
    from day0.results import charts

    jobs = []
    for c in record.checks():
        ev = c.evidence
        if isinstance(ev.get("samples"), list):
            xs = sorted(charts.clean_samples(ev["samples"], c.id))
            pts = charts.cdf_points(xs)
            jobs.append({"kind": "line", "title": f"{c.title}: CDF",
                         "series": [{"x": [p[0] for p in pts], "y": [p[1] for p in pts]}]})
            q = list(charts.PERCENTILES)
            jobs.append({"kind": "bar", "title": f"{c.title}: percentiles",
                         "series": [{"x": [f"p{v:g}" for v in q] + ["max"],
                                     "y": [charts.percentile(xs, v) for v in q] + [xs[-1]]}]})
        jobs += [spec for spec in ev.get("charts", [])]
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--stages", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    t0 = time.perf_counter()
    from day0.results import charts
    from day0.results.report import render
    from day0.results.signoff import Signatory, keygen, sign_report, verify_report

    import run_factory as rf

    import_s = time.perf_counter() - t0
    record = rf.huge(n_samples=args.samples, n_stages=args.stages)
    n_samples = sum(len(c.evidence.get("samples", [])) for c in record.checks())
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        src = rf.write(record, work / "run")
        run_mb = src.stat().st_size / 1e6
        times, cpu = [], []
        for i in range(args.repeat):
            t, c = time.perf_counter(), time.process_time()
            out = render(src, work / f"report{i}.html")
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        size = out.stat().st_size

        # Our SVG writer alone on the same charts, for a like-for-like ratio with matplotlib.
        jobs = chart_jobs(record)
        t = time.perf_counter()
        svg_bytes = sum(len(charts.render_spec(charts.parse_spec(j, "bench"))) for j in jobs)
        ours_s = time.perf_counter() - t

        priv, pub = keygen(work / "keys")
        t = time.perf_counter()
        sign_report(out, priv, Signatory("Bench", "CI"))
        sign_s = time.perf_counter() - t
        t = time.perf_counter()
        ok = verify_report(out, [pub]).ok
        verify_s = time.perf_counter() - t

        jobs_file = work / "jobs.json"
        jobs_file.write_text(json.dumps(jobs))
        proc = subprocess.run([sys.executable, "-c", MPL_SCRIPT, str(jobs_file)], capture_output=True, text=True)
        mpl = json.loads(proc.stdout) if proc.returncode == 0 else None

    first, best = times[0], min(times)
    print(f"record: {args.stages} stages, {sum(1 for _ in record.checks())} checks, {n_samples:,} samples "
          f"(run.json {run_mb:.2f} MB)")
    print(f"import day0.results.report: {import_s:.3f} s")
    print(f"render: first {first:.3f} s, best of {args.repeat} {best:.3f} s "
          f"(target < {TARGET_S} s: {'met' if first < TARGET_S else 'MISSED'}); "
          f"CPU time first {cpu[0]:.3f} s, best {min(cpu):.3f} s (wall > CPU means a shared, busy machine)")
    print(f"report size: {size / 1e6:.2f} MB (target < {TARGET_BYTES / 2**20:.0f} MiB: "
          f"{'met' if size < TARGET_BYTES else 'MISSED'})")
    print(f"sign: {sign_s:.3f} s, verify: {verify_s:.3f} s (ok={ok})")
    print(f"charts: {len(jobs)} drawn by day0.results.charts in {ours_s:.3f} s, {svg_bytes / 1e3:.0f} kB")
    if mpl is None:
        print(f"matplotlib baseline: not run ({(proc.stderr.strip().splitlines() or ['?'])[-1]})")
    else:
        print(f"matplotlib baseline: same {len(jobs)} charts in {mpl['total_s']:.3f} s "
              f"(import {mpl['import_s']:.3f} s), {mpl['bytes'] / 1e3:.0f} kB")
        print(f"ratio matplotlib / day0.results.charts: {mpl['total_s'] / max(ours_s, 1e-9):.0f}x time, "
              f"{mpl['bytes'] / max(svg_bytes, 1):.1f}x bytes; "
              f"matplotlib alone would use {mpl['total_s'] / TARGET_S:.0%} of the render budget")


if __name__ == "__main__":
    main()

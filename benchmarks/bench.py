"""Run ortagent's benchmarks side by side with onnxruntime, the C floor and the 1.19.2 agent.

    python -m benchmarks.bench [--quick] [--groups calls,values,agent,threads,startup,torch]
                               [--out DIR] [--rounds-scale F] [--burst-ms MS] [--no-plot]

(from the repository root: ``benchmarks`` and the model builders of ``ortagent_testkit`` are
packages there, and an in-place build of ortagent is found the same way).

``make bench`` (``make bench-quick`` for ``--quick``) sets up the environments and runs this.
Each group interleaves its contenders in rounds of short bursts within one process (the C
floor and the onnxruntime-training 1.19.2 agent run in helper processes that time their own
bursts and wait idle in between), so every figure in a table comes from the same minutes of
the same machine. A table per group is printed (median per call, q1-q3 over rounds, ratios
paired per round), then the targets with PASS/MISS. Results go to ``DIR/latest.json``,
``DIR/latest.md`` (the tables), ``DIR/summary.md`` (the short table, see summary.py) and
``DIR/latest.png`` (default DIR: build/bench, a build artefact: nothing here is committed).
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import _common, summary
from ._report import Group, markdown, plot

# threads first: it is the one group that needs the wall clock, and so a quiet machine
GROUPS = ("threads", "calls", "values", "agent", "startup", "torch", "torch_models")


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpus_online": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0))}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        for key, name in (("Model name", "cpu_model"), ("Core(s) per socket", "cores_per_socket"),
                          ("Socket(s)", "sockets"), ("Thread(s) per core", "threads_per_core"),
                          ("Hypervisor vendor", "hypervisor")):
            if key in fields:
                info[name] = fields[key]
    except (OSError, subprocess.SubprocessError):
        pass
    if "cpu_model" not in info:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=_common.REPO_ROOT, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "ortagent", "include",
                                "setup.py", "benchmarks/c_floor"], capture_output=True, text=True,
                               cwd=_common.REPO_ROOT, timeout=30)
        if head.returncode == 0:
            info["commit"] = head.stdout.strip()
            info["uncommitted"] = [line[3:] for line in dirty.stdout.splitlines()]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import numpy
        import onnxruntime

        import ortagent

        info["onnxruntime_python"] = onnxruntime.__version__
        info["ortagent_library"] = ortagent.get_version_string()
        info["numpy"] = numpy.__version__
        info["ortagent"] = ortagent.__version__
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        info["versions_error"] = repr(exc)
    return info


def _run_group(name: str, settings) -> Group:
    module = importlib.import_module(f".group_{name}", __package__)
    load_before = os.getloadavg()[0]
    try:
        group = module.run(settings)
    except Exception:  # noqa: BLE001 - one broken group must not lose the others
        group = Group(name, f"{name} (failed)")
        group.skipped = "failed: " + traceback.format_exc(limit=6).strip().splitlines()[-1]
        print(traceback.format_exc(), file=sys.stderr)
    group.load = (load_before, os.getloadavg()[0])
    return group


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds: a fast look")
    parser.add_argument("--groups", default=",".join(GROUPS),
                        help=f"comma-separated subset of {','.join(GROUPS)}")
    parser.add_argument("--out", type=Path, default=_common.RESULTS_DIR,
                        help="where latest.json, latest.md, summary.md and latest.png go "
                             "(default build/bench)")
    parser.add_argument("--rounds-scale", type=float, default=1.0,
                        help="multiply every group's number of rounds")
    parser.add_argument("--burst-ms", type=float, default=None,
                        help="length of one burst (default 30 ms, 10 ms with --quick)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="what the single-threaded groups (calls, values, agent) report: "
                             "the thread's CPU time (default; robust to other work on the "
                             "machine) or the wall clock; both are stored in latest.json")
    parser.add_argument("--wait-quiet", type=float, default=None, metavar="S",
                        help="before the threads group, wait up to S seconds for other processes "
                             "to leave both CPUs free (default 180, 0 with --quick)")
    parser.add_argument("--no-plot", action="store_true", help="skip latest.png")
    parser.add_argument("--torch-threads", type=int, default=1, metavar="N",
                        help="group 7: torch's threads and onnxruntime's intra-op threads (default 1; "
                             "above 1 the group is timed by the wall clock)")
    parser.add_argument("--torch-models", default="", metavar="TAGS",
                        help="group 7: a comma-separated subset of resnet18, mobilenet_v3, gpt2, bert, "
                             "llama, t5, vit (default all)")
    parser.add_argument("--torch-dynamic", choices=["default", "true"], default="default",
                        help="group 7: ORTModule's dynamic argument (default: its default, an export at the "
                             "first call's static shapes; true: symbolic dimensions from the first call)")
    args = parser.parse_args(argv)
    names = [g.strip() for g in args.groups.split(",") if g.strip()]
    unknown = sorted(set(names) - set(GROUPS))
    if unknown:
        parser.error(f"unknown groups {unknown}; choose from {GROUPS}")

    started = time.perf_counter()
    info = machine()
    info["busy_cpus_before"] = _common.background_busy()
    print(f"machine: {info.get('cpu_model', '?')}, {info.get('cpus_usable')} usable CPUs; "
          f"Python {info['python']}; onnxruntime (Python) {info.get('onnxruntime_python')}; "
          f"ortagent over libonnxruntime {info.get('ortagent_library')}", flush=True)
    groups: list[Group] = []
    with tempfile.TemporaryDirectory(prefix="ortagent-bench-") as workdir:
        settings = _common.Settings.make(args.quick, Path(workdir), args.rounds_scale, args.burst_ms,
                                         args.clock)
        settings.extra["torch_threads"] = args.torch_threads
        settings.extra["torch_dynamic"] = args.torch_dynamic == "true" or None
        if args.torch_models:
            settings.extra["torch_models"] = {t.strip() for t in args.torch_models.split(",") if t.strip()}
        settings.wait_quiet_s = (args.wait_quiet if args.wait_quiet is not None
                                 else 0.0 if args.quick else 180.0)
        for name in names:
            group = _run_group(name, settings)
            groups.append(group)
            print(group.table(), flush=True)
            print(flush=True)
    groups.sort(key=lambda g: g.title)      # "1. ..." to "5. ...", whatever ran first
    info["busy_cpus_after"] = _common.background_busy()
    elapsed = time.perf_counter() - started

    targets = [t for g in groups for t in g.targets]
    print("== targets ==")
    for t in targets:
        print(f"  {t.line()}")
    busy = [b for b in (info["busy_cpus_before"], info["busy_cpus_after"]) if b is not None]
    if busy and max(busy) > 0.25:
        print(f"  warning: other processes kept {max(busy):.1f} of {os.cpu_count()} CPUs busy "
              "(measured for 1 s before and after): the figures are noisier than on a quiet machine")
    counts = {s: sum(t.status == s for t in targets) for s in ("PASS", "MISS", "n/a")}
    print(f"  {counts['PASS']} PASS, {counts['MISS']} MISS, {counts['n/a']} n/a; "
          f"{elapsed:.0f} s in all{' (--quick)' if args.quick else ''}")

    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": args.quick, "seconds": round(elapsed, 1), "machine": info,
        "settings": {"burst_s": settings.burst_s, "rounds": settings.rounds,
                     "clock": settings.clock,
                     "session": _common.SESSION_SETTINGS},
        "groups": [g.as_json() for g in groups],
        "targets": [t.as_json() for t in targets],
        "summary": counts,
    }
    json_path = args.out / "latest.json"
    json_path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {json_path}")
    md_path = args.out / "latest.md"
    md_path.write_text(markdown(
        groups, targets,
        f"Run {result['created']}{' (--quick)' if args.quick else ''} on {info.get('cpu_model', '?')} "
        f"({info.get('cpus_usable')} usable CPUs, {info.get('cores_per_socket', '?')} cores per "
        f"socket x {info.get('sockets', '?')}), Python {info['python']}, onnxruntime "
        f"{info.get('onnxruntime_python')} (Python) / {info.get('ortagent_library')} (ortagent's "
        f"library); {elapsed:.0f} s; commit {info.get('commit', '?')}"
        + (f" with uncommitted changes in {', '.join(info['uncommitted'])}"
           if info.get("uncommitted") else "") + "."))
    print(f"wrote {md_path}")
    summary_path = args.out / "summary.md"
    summary_path.write_text(summary.markdown(result))
    print(f"wrote {summary_path} (the short table of benchmarks/README.md)")
    if not args.no_plot:
        png_path = args.out / "latest.png"
        title = (f"ortagent benchmarks, {result['created']}: {info.get('cpu_model', '?')}, "
                 f"{info.get('cpus_usable')} CPUs{' (quick)' if args.quick else ''}; "
                 f"bars: median ratio per round, whiskers q1-q3")
        try:
            plot(groups, targets, png_path, title)
            print(f"wrote {png_path}")
        except ImportError as exc:
            print(f"no plot: {exc} (pip install matplotlib)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

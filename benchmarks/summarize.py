"""Turn a pytest-benchmark JSON file into markdown tables: medians and ratios within the same run.

    python benchmarks/summarize.py out.json [--baseline fastckpt --baseline plain]

Per group the ratios divide by the first baseline case present.  Where a case
records a plan, the table adds the predicted peak, the recompute factor and
the step-time overhead over the baseline next to the plan's extra-FLOP fraction.
"""
import argparse
import json

MiB = 2**20


def _cell(value, fmt, suffix=""):
    return "-" if value is None else format(value, fmt) + suffix


def _ms(seconds):
    """Milliseconds to about four significant digits."""
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms >= 100 else f"{ms:.2f}" if ms >= 10 else f"{ms:.3f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file")
    parser.add_argument("--baseline", action="append", help="case ids the ratios divide by (default: fastckpt, plain)")
    args = parser.parse_args(argv)
    baselines = args.baseline or ["fastckpt", "plain"]
    with open(args.json_file) as f:
        data = json.load(f)
    info = data["machine_info"]
    print(f"Machine: {info.get('cpu', {}).get('brand_raw', '?')}, {info.get('cpu', {}).get('count', '?')} cores; "
          f"{data['datetime'][:10]}\n")
    groups = {}
    for bench in data["benchmarks"]:
        groups.setdefault(bench["group"], []).append(bench)
    for group, benches in groups.items():
        case = {b["param"]: b for b in benches}
        name = next((n for n in baselines if n in case), None)
        base = case.get(name)
        planned = any("predicted_bytes" in b["extra_info"] for b in benches)
        print(f"**{group}**\n")
        head = f"| case | median ms/step | x {name or '-'} | memray peak MiB |"
        rule = "|---|---:|---:|---:|"
        if planned:
            head += " predicted MiB | recompute factor | time overhead | extra FLOPs |"
            rule += "---:|---:|---:|---:|"
        print(head)
        print(rule)
        for b in benches:
            extra = b["extra_info"]
            ratio = b["stats"]["median"] / base["stats"]["median"] if base else None
            peak = extra.get("memray_peak_bytes")
            row = (f"| {b['param']} | {_ms(b['stats']['median'])} | {_cell(ratio, '.2f')} | "
                   f"{_cell(peak and peak / MiB, '.2f')} |")
            if planned:
                pred = extra.get("predicted_bytes")
                flops = extra.get("extra_flop_fraction")
                row += (f" {_cell(pred and pred / MiB, '.2f')} | {_cell(extra.get('recompute_factor'), '.3f')} |"
                        f" {_cell(None if ratio is None or flops is None else 100 * (ratio - 1), '+.1f', '%')} |"
                        f" {_cell(None if flops is None else 100 * flops, '.1f', '%')} |")
            print(row)
        print()


if __name__ == "__main__":
    main()

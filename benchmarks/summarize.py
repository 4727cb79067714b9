"""Turn a pytest-benchmark JSON file into a markdown table: medians and ratios within the same run.

    python benchmarks/summarize.py out.json [--baseline fastckpt]
"""
import argparse
import json


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file")
    parser.add_argument("--baseline", default="fastckpt", help="case id the ratios divide by")
    args = parser.parse_args(argv)
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
        base = case.get(args.baseline)
        print(f"**{group}**\n")
        print(f"| implementation | median ms/step | x {args.baseline} | memray peak MiB |")
        print("|---|---:|---:|---:|")
        for b in benches:
            med = b["stats"]["median"] * 1e3
            ratio = f"{b['stats']['median'] / base['stats']['median']:.2f}" if base else "-"
            peak = b["extra_info"].get("memray_peak_bytes")
            peak = f"{peak / 2**20:.2f}" if peak else "-"
            print(f"| {b['param']} | {med:.3f} | {ratio} | {peak} |")
        print()


if __name__ == "__main__":
    main()

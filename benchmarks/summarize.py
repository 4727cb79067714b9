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
        case = {_label(b): b for b in benches}           # test_peers' ids are whole; its peer is the baseline
        name = next((n for n in baselines if n in case), None)
        base = case.get(name)
        planned = any("predicted_bytes" in b["extra_info"] for b in benches)
        print(f"**{group}**\n")
        head = f"| case | median ms/step | x {name or '-'} | memray peak MiB | GFLOP/s |"
        rule = "|---|---:|---:|---:|---:|"
        if planned:
            head += " predicted MiB | recompute factor | time overhead | extra FLOPs |"
            rule += "---:|---:|---:|---:|"
        print(head)
        print(rule)
        for b in benches:
            extra = b["extra_info"]
            ratio = b["stats"]["median"] / base["stats"]["median"] if base else None
            peak = extra.get("memray_peak_bytes")
            row = (f"| {_label(b)} | {_ms(b['stats']['median'])} | {_cell(ratio, '.2f')} | "
                   f"{_cell(peak and peak / MiB, '.2f')} | {_cell(extra.get('gflops_per_s'), '.1f')} |")
            if planned:
                pred = extra.get("predicted_bytes")
                flops = extra.get("extra_flop_fraction")
                overhead = None if ratio is None or flops is None or (b is base and flops) else 100 * (ratio - 1)
                row += (f" {_cell(pred and pred / MiB, '.2f')} | {_cell(extra.get('recompute_factor'), '.3f')} |"
                        f" {_cell(overhead, '+.1f', '%')} |"
                        f" {_cell(None if flops is None else 100 * flops, '.1f', '%')} |")
            print(row)
        print()
    if any("peer" in b["params"] for b in data["benchmarks"] if b.get("params")):
        goals(data["benchmarks"])


def _label(bench):
    """The peer's name for test_peers' cases, the parameter otherwise."""
    params = bench.get("params") or {}
    return params.get("peer", bench["param"])


def goals(benches):
    """The performance goals as ratios measured in this run."""
    med, peak = {}, {}
    for b in benches:
        p = b.get("params") or {}
        if "peer" in p:
            med[p["net"], p["dtype"], p["mode"], p["peer"]] = b["stats"]["median"]
            if "memray_peak_bytes" in b["extra_info"]:
                peak[p["net"], p["dtype"], p["mode"], p["peer"]] = b["extra_info"]["memray_peak_bytes"]

    def mem(net, dtype, mode, peer="torch"):
        a, b = (net, dtype, mode, "fastckpt"), (net, dtype, mode, peer)
        return f"{peak[a] / peak[b]:.2f}" if a in peak and b in peak else "-"

    def ratio(a, b):
        return f"{med[a] / med[b]:.2f}" if a in med and b in med else "-"

    def limit(net, dtype):
        keys = [(net, dtype, "plain", peer) for peer in ("gemm-only numpy", "gemm-only torch")]
        keys = [k for k in keys if k in med]
        return min(keys, key=med.get) if keys else None
    print("**Goals (ratios in this run)**\n")
    print("| net | dtype | plain / torch | plain / GEMM limit (BLAS) | checkpointed / torch checkpoint_sequential |"
          " peak / torch peak, plain | peak / torch peak, checkpointed |"
          " plain / jax | checkpointed / jax.checkpoint | peak / jax peak, plain | peak / jax peak, checkpointed |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    nets = sorted({k[0] for k in med}, key=["lab", "deep-narrow", "shallow-wide"].index)
    for net in nets:
        for dtype in ("float64", "float32"):
            lim = limit(net, dtype)
            blas = "-" if lim is None else f"{ratio((net, dtype, 'plain', 'fastckpt'), lim)} ({lim[3][10:]})"
            plain = ratio((net, dtype, "plain", "fastckpt"), (net, dtype, "plain", "torch"))
            ckpt = ratio((net, dtype, "checkpointed", "fastckpt"), (net, dtype, "checkpointed", "torch"))
            jax = [ratio((net, dtype, m, "fastckpt"), (net, dtype, m, "jax")) for m in ("plain", "checkpointed")]
            print(f"| {net} | {dtype} | {plain} | {blas} | {ckpt} | {mem(net, dtype, 'plain')} |"
                  f" {mem(net, dtype, 'checkpointed')} | {jax[0]} | {jax[1]} | {mem(net, dtype, 'plain', 'jax')} |"
                  f" {mem(net, dtype, 'checkpointed', 'jax')} |")
    print()
    for net in nets:
        print(f"- {net}: fastckpt float32 / float64 step: "
              f"{ratio((net, 'float32', 'plain', 'fastckpt'), (net, 'float64', 'plain', 'fastckpt'))} plain, "
              f"{ratio((net, 'float32', 'checkpointed', 'fastckpt'), (net, 'float64', 'checkpointed', 'fastckpt'))}"
              f" checkpointed; PyTorch: "
              f"{ratio((net, 'float32', 'plain', 'torch'), (net, 'float64', 'plain', 'torch'))} plain")
    for net in nets:                                         # does remat lower each peer's peak?
        for dtype in ("float64", "float32"):
            pairs = [(peer, (net, dtype, "checkpointed", peer), (net, dtype, "plain", peer))
                     for peer in ("fastckpt", "torch", "jax")]
            cells = [f"{peer} {peak[c] / peak[p]:.2f}" for peer, c, p in pairs if c in peak and p in peak]
            if cells:
                print(f"- {net} {dtype}: checkpointed peak / plain peak: {', '.join(cells)}")
    print()


if __name__ == "__main__":
    main()

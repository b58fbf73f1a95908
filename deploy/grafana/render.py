#!/usr/bin/env python3
"""Renders deploy/grafana/ringlet.json's panels to a PNG from a Prometheus server, without Grafana.

Each panel's queries are evaluated with Prometheus' query_range API over the window given
($instance becomes .*, $__rate_interval the --rate-interval), laid out on the dashboard's grid and
plotted with matplotlib: time series as lines, heat maps as per-bucket counts (the cumulative
`le` buckets differenced, as Grafana does for `format: heatmap`), stat panels as the names of the
series whose last value is non-zero. It is a picture of what the queries return, not Grafana's
rendering.

    render.py --prometheus http://127.0.0.1:19090 --start 1700000000 --end 1700000300 \
        --out deploy/grafana/ringlet.png
"""

import argparse
import datetime
import json
import math
import pathlib
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import colors  # noqa: E402

DASHBOARD = pathlib.Path(__file__).with_name("ringlet.json")


def query_range(prometheus, expr, start, end, step):
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as reply:
        body = json.load(reply)
    if body.get("status") != "success":
        raise SystemExit(f"query {expr!r} failed: {body}")
    return body["data"]["result"]


def substitute(expr, rate_interval):
    for variable in ("${__rate_interval}", "$__rate_interval"):
        expr = expr.replace(variable, rate_interval)
    return expr.replace("${instance}", ".*").replace("$instance", ".*")


def legend(template, metric):
    text = template or "{{__name__}}"
    for key, value in metric.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def times(values):
    return [datetime.datetime.fromtimestamp(float(t), datetime.timezone.utc) for t, _ in values]


def plot_timeseries(ax, panel, results):
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    log = (
        panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("scaleDistribution", {}).get("type")
        == "log"
    )
    plotted = False
    for target, series in results:
        for s in series:
            ys = [float(v) for _, v in s["values"]]
            if not any(math.isfinite(y) for y in ys):
                continue
            ax.plot(times(s["values"]), ys, linewidth=1, label=legend(target.get("legendFormat"), s["metric"]))
            plotted = True
    if log and plotted:
        ax.set_yscale("log")
    if unit:
        ax.set_ylabel(unit, fontsize=7)
    if plotted:
        ax.legend(fontsize=6, loc="upper left")
    else:
        no_data(ax)
    return plotted


def no_data(ax):
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")


def plot_heatmap(ax, results):
    series = [s for _, found in results for s in found]
    buckets = sorted(
        ((float(s["metric"]["le"]), s) for s in series if "le" in s["metric"]), key=lambda b: b[0]
    )
    if not buckets or not any(float(v) > 0 for _, s in buckets for _, v in s["values"]):
        no_data(ax)
        return False
    stamps = times(buckets[0][1]["values"])
    cumulative = [[float(v) for _, v in s["values"]] for _, s in buckets]
    counts = [cumulative[0]] + [
        [max(h - l, 0.0) for h, l in zip(high, low)] for high, low in zip(cumulative[1:], cumulative)
    ]
    finite = [le for le, _ in buckets if math.isfinite(le)]
    edges = [finite[0] / 1.78] + finite
    rows = counts[: len(finite)]
    x = mdates.date2num(stamps)
    x_edges = list(x) + [x[-1] + (x[-1] - x[-2] if len(x) > 1 else 1 / 86400)]
    peak = max(max(r) for r in rows) or 1
    mesh = ax.pcolormesh(
        x_edges, edges, rows, cmap="Oranges", norm=colors.PowerNorm(0.5, vmin=0, vmax=peak), shading="flat"
    )
    ax.set_yscale("log")
    ax.set_ylabel("s", fontsize=7)
    ax.xaxis_date()
    plt.colorbar(mesh, ax=ax, pad=0.01).ax.tick_params(labelsize=6)
    return True


def plot_stat(ax, results):
    names = [
        legend(target.get("legendFormat"), s["metric"])
        for target, series in results
        for s in series
        if s["values"] and float(s["values"][-1][1]) != 0
    ]
    ax.axis("off")
    ax.text(0.5, 0.5, ", ".join(names) or "no data", ha="center", va="center", fontsize=16,
            transform=ax.transAxes, color="white" if names else "grey",
            bbox={"facecolor": "green", "boxstyle": "round"} if names else None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--end", type=float, required=True)
    parser.add_argument("--step", default="5s")
    parser.add_argument("--rate-interval", default="30s")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(20, height * 0.42))
    grid = fig.add_gridspec(height, 24, hspace=2.2, wspace=1.2, top=0.97, bottom=0.02)
    for panel in panels:
        pos = panel["gridPos"]
        ax = fig.add_subplot(grid[pos["y"]: pos["y"] + pos["h"], pos["x"]: pos["x"] + pos["w"]])
        if panel["type"] == "row":
            ax.axis("off")
            ax.text(0, 0.2, panel["title"], fontsize=12, fontweight="bold", transform=ax.transAxes)
            continue
        results = [
            (t, query_range(args.prometheus, substitute(t["expr"], args.rate_interval),
                            args.start, args.end, args.step))
            for t in panel.get("targets", [])
        ]
        ax.set_title(panel["title"], fontsize=9, loc="left")
        ax.tick_params(labelsize=6)
        if panel["type"] == "stat":
            plot_stat(ax, results)
            continue
        plot = plot_heatmap if panel["type"] == "heatmap" else lambda ax, r: plot_timeseries(ax, panel, r)
        if plot(ax, results):
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    fig.suptitle(
        f"{dashboard['title']}: panels of deploy/grafana/ringlet.json evaluated by render.py "
        "(not a Grafana screenshot)", fontsize=11,
    )
    fig.savefig(args.out, dpi=80, bbox_inches="tight")


if __name__ == "__main__":
    main()

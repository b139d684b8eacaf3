#!/usr/bin/env python3
"""Turns what bench/experiments.sh collected (Chrome traces, `pipetrain timeline
--breakdown --json`, `pipetrain status --json`) into whitespace-separated tables that the
gnuplot scripts beside this file draw. Standard library only.

  experiment_data.py gantt MEASURED_TRACE PREDICTED_TRACE OUT
  experiment_data.py breakdown OUT LABEL=BREAKDOWN.json [LABEL=BREAKDOWN.json ...]
  experiment_data.py bubble STATUS.json OUT
  experiment_data.py scaling SCALING.dat OUT
  experiment_data.py whatif OUT SCHEDULE=PLAN.json,BREAKDOWN.json,STATUS.json [...]
  experiment_data.py precision FP32_STATUS.json BF16_STATUS.json OUT
"""
import json
import sys

# The Gantt's colours, by what an action is (its name's prefix).
KINDS = ["F", "B", "I", "W", "SEND", "RECV", "OPT"]


def kind_of(name):
    base = name.split("@")[0]
    for prefix in ("SEND", "RECV", "OPT"):
        if base.startswith(prefix):
            return prefix
    return base.rstrip("0123456789") or "F"


def trace_events(path):
    with open(path) as f:
        trace = json.load(f)
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]


def gantt(measured_path, predicted_path, out_path):
    """One row per action: panel (0 measured, 1 predicted), stage, start and end in ms
    from the step's start, the kind's index in KINDS, the action. The measured trace's
    last step only."""
    measured = trace_events(measured_path)
    if not measured:
        sys.exit(f"experiment_data.py: {measured_path} has no events")
    last = max(e.get("args", {}).get("step", 0) for e in measured)
    measured = [e for e in measured if e.get("args", {}).get("step", 0) == last]
    rows = []
    for panel, events in ((0, measured), (1, trace_events(predicted_path))):
        if not events:
            continue
        t0 = min(e["ts"] for e in events)
        for e in events:
            kind = kind_of(e["name"])
            if e.get("cat") == "wait":
                kind = "RECV"
            if e["dur"] <= 0:
                continue
            start = (e["ts"] - t0) / 1000.0
            rows.append((panel, e["pid"], start, start + e["dur"] / 1000.0,
                         KINDS.index(kind) if kind in KINDS else 0, e["name"]))
    with open(out_path, "w") as f:
        f.write(f"# measured step {last} (panel 0) and its prediction (panel 1)\n")
        f.write("# panel stage start_ms end_ms kind action   kinds: " + " ".join(KINDS) + "\n")
        for r in rows:
            f.write("%d %d %.3f %.3f %d %s\n" % r)


BREAKDOWN = ["forward", "backward", "backward_input", "backward_weight", "recompute",
             "optimizer", "send", "recv_wait", "idle"]


def breakdown(out_path, pairs):
    """One row per (schedule, stage): the label 'SCHEDULE/sN', then each part's share of
    the step in percent, in BREAKDOWN's order; an empty bar ('""', zeros) between
    schedules."""
    with open(out_path, "w") as f:
        f.write("# label " + " ".join(BREAKDOWN) + "   (percent of the step)\n")
        for n, pair in enumerate(pairs):
            if n > 0:
                f.write('"" ' + " ".join("0" for _ in BREAKDOWN) + "\n")
            label, path = pair.split("=", 1)
            with open(path) as g:
                b = json.load(g)
            for st in b["stages"]:
                step = b["step_time_s"]
                shares = [100.0 * st.get(k + "_s", 0.0) / step if step > 0 else 0 for k in BREAKDOWN]
                f.write(f"{label}/s{st['stage']} " + " ".join("%.2f" % x for x in shares) + "\n")


def bubble(status_path, out_path):
    """step, measured bubble, fitted prediction (NaN before the fit), the cost model's
    guess (NaN once fitted)."""
    with open(status_path) as f:
        status = json.load(f)
    with open(out_path, "w") as f:
        f.write("# step measured fitted cost_model\n")
        for s in status.get("history", []):
            fitted = s.get("predicted_fitted", False)
            p = s.get("bubble_predicted", 0.0)
            f.write("%d %.4f %s %s\n" % (int(s["step"]), s.get("bubble_measured", 0.0),
                                         "%.4f" % p if fitted else "NaN",
                                         "NaN" if fitted else "%.4f" % p))


def precision(fp32_path, bf16_path, out_path):
    """step, fp32 loss, bf16 loss, fp32 validation loss, bf16 validation loss (NaN on
    steps without validation), from two jobs' `pipetrain status --json`; prints the
    last validation losses and the mean training loss of the last 50 steps of each."""
    runs = []
    for path in (fp32_path, bf16_path):
        with open(path) as f:
            runs.append({int(s["step"]): s for s in json.load(f).get("history", [])})
    val = lambda s: "%.5f" % s["val_loss"] if s.get("has_val_loss") else "NaN"
    with open(out_path, "w") as f:
        f.write("# step fp32_loss bf16_loss fp32_val bf16_val\n")
        for step in sorted(set(runs[0]) & set(runs[1])):
            a, b = runs[0][step], runs[1][step]
            f.write("%d %.5f %.5f %s %s\n" % (step, a["loss"], b["loss"], val(a), val(b)))
    for name, run in zip(("fp32", "bf16"), runs):
        steps = sorted(run)
        last_val = [run[s]["val_loss"] for s in steps if run[s].get("has_val_loss")][-1]
        tail = [run[s]["loss"] for s in steps[-50:]]
        print("%s: validation loss at step %d %.4f, mean training loss of the last %d "
              "steps %.4f" % (name, steps[-1], last_val, len(tail), sum(tail) / len(tail)))


def scaling(in_path, out_path):
    """pipetrain-bench scaling's table regrouped for lines: one block per (schedule, M),
    sorted by K and starting from the K = 1 baseline (measured once, with gpipe), blocks
    apart by a blank line."""
    rows = []
    with open(in_path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            k, m, schedule, *rest = line.split()
            rows.append((int(k), int(m), schedule, rest))
    schedules = sorted({r[2] for r in rows}, key=lambda s: ["gpipe", "1f1b", "interleaved",
                                                           "zb-h1"].index(s) if s in
                       ["gpipe", "1f1b", "interleaved", "zb-h1"] else 9)
    base = {r[1]: r for r in rows if r[0] == 1}
    with open(out_path, "w") as f:
        f.write("# K M schedule measured_speedup ideal bound tokens_per_s\n")
        for schedule in schedules:
            for m in sorted({r[1] for r in rows}):
                block = sorted((r for r in rows if r[2] == schedule and r[1] == m and r[0] > 1))
                if not block:
                    continue
                if m in base:
                    block.insert(0, base[m])
                for k, mm, _, rest in block:
                    f.write(f"{k} {mm} {schedule} " + " ".join(rest) + "\n")
                f.write("\n")


def whatif(out_path, triples):
    """Per schedule: the step time and bubble `pipetrain plan --costs-from` predicted
    (PLAN.json, --json) against what the schedule's own job measured over the same
    steps the breakdown averaged (BREAKDOWN.json: stage-time step; STATUS.json: each
    step's bubble)."""
    lines = ["# schedule predicted_step_ms measured_step_ms predicted_bubble measured_bubble"]
    for t in triples:
        schedule, files = t.split("=", 1)
        plan_path, breakdown_path, status_path = files.split(",")
        with open(plan_path) as f:
            plan = json.load(f)
        with open(breakdown_path) as f:
            b = json.load(f)
        with open(status_path) as f:
            history = json.load(f).get("history", [])
        steps = {int(x) for x in b.get("steps", [])}
        bubbles = [h["bubble_measured"] for h in history if int(h["step"]) in steps]
        measured_bubble = sum(bubbles) / len(bubbles) if bubbles else float("nan")
        lines.append("%s %.2f %.2f %.3f %.3f" % (schedule, plan["step_time_s"] * 1e3,
                                                 b["step_time_s"] * 1e3,
                                                 plan["bubble_fraction"], measured_bubble))
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv):
    if len(argv) == 5 and argv[1] == "gantt":
        gantt(argv[2], argv[3], argv[4])
    elif len(argv) >= 4 and argv[1] == "breakdown":
        breakdown(argv[2], argv[3:])
    elif len(argv) >= 4 and argv[1] == "whatif":
        whatif(argv[2], argv[3:])
    elif len(argv) == 4 and argv[1] == "scaling":
        scaling(argv[2], argv[3])
    elif len(argv) == 4 and argv[1] == "bubble":
        bubble(argv[2], argv[3])
    elif len(argv) == 5 and argv[1] == "precision":
        precision(argv[2], argv[3], argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)

#!/usr/bin/env python3
"""Issue 21's reproducers, run on a dptrain binary: one table row per case.

    scripts/reliability_table.py [--bin target/release/dptrain] [--only 1,6,8]

Each case runs in a fresh temporary directory, under `ulimit -v 4000000` (as the issue measured)
and a 120 s watchdog, and prints: the row, the command, the exit code (or "killed after 120 s"),
the peak RSS (`/usr/bin/time -f %M`), and the first line of output. Python's standard library
only; the files each case needs (model files, fifos, torn logs) are generated here.
Rows 8 and 9 need more than one command (two runs at once; a 200 KiB tmpfs, root only).
"""

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

AS_LIMIT = 4_000_000 * 1024  # ulimit -v 4000000 (KiB)
WATCHDOG_S = 120
T = ["--train-limit", "512", "--test-limit", "128", "--epochs", "1", "--threads", "1"]

CONV = """name = "m"
input = [1, 28, 28]
layers = [
  {{ type = "conv2d", name = "c", {conv} }},
  {{ type = "flatten" }},
  {{ type = "linear", name = "fc", out = "classes" }},
]
"""


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def template_bomb(levels, uses):
    """A model file whose templates each use the next one `uses` times: uses**levels layers."""
    lines = ['name = "bomb"', "input = [1, 28, 28]", 'layers = [{ use = "t0" }, { type = "flatten" },',
             '  { type = "linear", name = "fc", out = "classes" }]']
    for level in range(levels):
        if level + 1 < levels:
            body = ", ".join(f'{{ use = "t{level + 1}", name = "u{i}" }}' for i in range(uses))
        else:
            body = '{ type = "relu" }'
        lines.append(f"[template.t{level}]\nlayers = [{body}]")
    return "\n".join(lines) + "\n"


def relu_chain(n):
    body = ",\n".join('  { type = "relu" }' for _ in range(n))
    return ('name = "deep"\ninput = [1, 28, 28]\nlayers = [\n' + body +
            ',\n  { type = "flatten" },\n  { type = "linear", name = "fc", out = "classes" },\n]\n')


def mkfifo(path):
    os.mkfifo(path)
    return path


def run(binary, args, cwd, shell_tail=None):
    """Runs one command; returns (exit, peak RSS KiB, first output line, seconds)."""
    rss_file = os.path.join(cwd, ".rss")
    argv = ["/usr/bin/time", "-o", rss_file, "-f", "%M", binary] + args
    cmd = argv if shell_tail is None else ["sh", "-c", " ".join(map(quote, argv)) + " " + shell_tail]

    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
        os.setsid()

    start = time.monotonic()
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         preexec_fn=limits)
    try:
        out, _ = p.communicate(timeout=WATCHDOG_S)
        code = str(p.returncode)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, _ = p.communicate()
        code = f"killed after {WATCHDOG_S} s"
    secs = time.monotonic() - start
    try:
        rss = open(rss_file).read().split()[-1]
        os.remove(rss_file)
    except (OSError, IndexError):
        rss = "?"
    lines = [l for l in out.decode(errors="replace").splitlines() if l.strip()]
    # /usr/bin/time reports a signal as "Command terminated by signal N" / "exited with".
    lines = [l for l in lines if not l.startswith("Command ")]
    # The line that says what happened: an error, warning or crash first, else the first.
    marked = [l for l in lines if any(k in l for k in ("error", "warning", "panicked",
                                                         "memory allocation", "overflow",
                                                         "run directory:", "continuing"))]
    first = (marked or lines or [""])[0]
    return code, rss, first, secs


def quote(s):
    return "'" + s.replace("'", "'\\''") + "'" if any(c in s for c in " $\"'()|;&<>*") else s


def cases(tmp):
    """(row, shown command, args, setup) for each reproducer."""
    c = []

    def model(name, text):
        write(os.path.join(tmp, name), text)
        return name

    m = model("pad.toml", CONV.format(conv="out = 4, kernel = 5, padding = 9223372036854775807"))
    c.append(("1", "train --model pad.toml (padding 2^63-1) $T", ["train", "--model", m] + T))
    m = model("dil.toml", CONV.format(conv="out = 4, kernel = 4294967297, dilation = 4294967296"))
    c.append(("1", "model show dil.toml (kernel 2^32+1, dilation 2^32)", ["model", "show", m]))
    m = model("out.toml", CONV.format(conv='out = "$channels * 4000000000000000000", kernel = 3'))
    c.append(("1", "model show out.toml (out = $channels * 4e18)", ["model", "show", m]))
    parens = "(" * 20000 + "10" + ")" * 20000
    m = model("parens.toml", CONV.format(conv=f'out = "{parens}", kernel = 3'))
    c.append(("2", "model show parens.toml (20,000 parentheses)", ["model", "show", m]))
    for label, conv in [("conv out 1e9", "out = 1000000000, kernel = 3"),
                        ("conv out 4e18", "out = 4000000000000000000, kernel = 3"),
                        ("kernel 100001 padding 50000", "out = 4, kernel = 100001, padding = 50000")]:
        m = model(f"big{len(c)}.toml", CONV.format(conv=conv))
        c.append(("3", f"train --model {m} ({label}) $T", ["train", "--model", m] + T))
    m = model("lin.toml", 'name = "m"\ninput = [1, 28, 28]\nlayers = [\n  { type = "flatten" },\n'
              '  { type = "linear", name = "a", out = 1000000000 },\n'
              '  { type = "linear", name = "fc", out = "classes" },\n]\n')
    c.append(("3", "train --model lin.toml (linear out 1e9) $T", ["train", "--model", m] + T))
    m = model("bomb7.toml", template_bomb(8, 14))
    c.append(("4", "model show bomb7.toml (7 levels x 14 uses: 1e8 layers)", ["model", "show", m]))
    m = model("bomb1m.toml", template_bomb(7, 10))
    c.append(("4", "model show bomb1m.toml (6 levels x 10 uses: 1e6 layers)", ["model", "show", m]))
    for n in (20_000, 100_000):
        m = model(f"relu{n}.toml", relu_chain(n))
        c.append(("5", f"model show relu{n}.toml ({n} relu layers)", ["model", "show", m]))
    m = model("relu2m.toml", relu_chain(2_500_000))
    c.append(("5", "model show relu2m.toml (52 MB file)", ["model", "show", m]))
    fifo = mkfifo(os.path.join(tmp, "fifo"))
    for path in ("/dev/zero", fifo):
        shown = "FIFO" if path == fifo else path
        c.append(("6", f"model show {shown}", ["model", "show", path]))
        c.append(("6", f"train --config {shown}", ["train", "--config", path] + T))
        c.append(("6", f"train --emulate-device {shown} $T", ["train", "--emulate-device", path] + T))
        c.append(("6", f"simulate --profile {shown}", ["simulate", "--profile", path]))
    idx = os.path.join(tmp, "idx")
    os.mkdir(idx)
    for f in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
              "t10k-labels-idx1-ubyte"):
        os.symlink("/dev/zero", os.path.join(idx, f))
    c.append(("6", "train --dataset idx:idx (IDX files -> /dev/zero) $T",
              ["train", "--dataset", f"idx:{idx}"] + T))
    fidx = os.path.join(tmp, "fidx")
    os.mkdir(fidx)
    for f in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
              "t10k-labels-idx1-ubyte"):
        mkfifo(os.path.join(fidx, f))
    c.append(("6", "train --dataset idx:fidx (IDX files fifos) $T",
              ["train", "--dataset", f"idx:{fidx}"] + T))
    rep = os.path.join(tmp, "rep")
    os.mkdir(rep)
    mkfifo(os.path.join(rep, "summary.json"))
    c.append(("6", "report rep (summary.json a fifo)", ["report", rep]))
    c.append(("7", "train $T | head -1", ["train", "--run-dir", "r7"] + T, "| head -1"))
    c.append(("7", "model show resnet50 > /dev/full", ["model", "show", "resnet50"], "> /dev/full"))
    torn = os.path.join(tmp, "torn")
    c.append(("10", "report torn (last metrics line torn)", ["report", torn]))
    m = model("esc.toml", 'name = "../../escaped"\n' + CONV.format(conv="out = 4, kernel = 3")
              .split("\n", 1)[1])
    c.append(("11", "train --model esc.toml (name ../../escaped) $T", ["train", "--model", m] + T))
    c.append(("12", "train --run-dir r12 $T (r12 holds thesis.99999.0.tmp)",
              ["train", "--run-dir", "r12", "--quiet"] + T))
    c.append(("13", "train --augment flip,flip,crop:2,crop:4 $T",
              ["train", "--augment", "flip,flip,crop:2,crop:4"] + T))
    c.append(("14", "train --workers 1000 --batch 1000 --train-limit 2000 --epochs 1",
              ["train", "--workers", "1000", "--batch", "1000", "--train-limit", "2000",
               "--test-limit", "128", "--epochs", "1"]))
    c.append(("14", "bench allreduce --workers 1000 --sizes 4K",
              ["bench", "allreduce", "--workers", "1000", "--sizes", "4K"]))
    c.append(("14", "bench allreduce --sizes 1G (ulimit -v 4000000)",
              ["bench", "allreduce", "--sizes", "1G"]))
    ckpt = os.path.join(tmp, "ckpt", "checkpoint-epoch0001.safetensors")
    c.append(("14", "eval --checkpoint CKPT --batch 99999999999",
              ["eval", "--checkpoint", ckpt, "--batch", "99999999999"]))
    c.append(("15", "train --keep-checkpoints 0 $T", ["train", "--keep-checkpoints", "0"] + T))
    # The unclear messages.
    m = model("classes0.toml", 'name = "m"\nclasses = 0\n' + CONV.format(conv="out = 4, kernel = 3")
              .split("\n", 1)[1])
    c.append(("msg", "model show classes0.toml (classes = 0)", ["model", "show", m]))
    m = model("ctrl.toml", CONV.format(conv="out = 4, kernel = 3").replace('"c"', '"c\\u001b[2J"'))
    c.append(("msg", "model show ctrl.toml (a layer name with ESC)", ["model", "show", m]))
    c.append(("msg", "report missing-dir", ["report", "missing-dir"]))
    c.append(("msg", "train --lr-schedule step:2,2 $T", ["train", "--lr-schedule", "step:2,2"] + T))
    c.append(("msg", "train --resume CKPT --epochs 2 (no --run-dir)",
              ["train", "--resume", ckpt, "--train-limit", "512", "--test-limit", "128",
               "--epochs", "2", "--threads", "1", "--quiet"]))
    c.append(("msg", "train --resume CKPT --model resnet20",
              ["train", "--resume", ckpt, "--model", "resnet20"] + T))
    c.append(("msg", "bench sim-check --help | grep -A1 -- --model", ["bench", "sim-check", "--help"],
              "| grep -A1 -- '--model <' | tr -s ' \\n' ' '"))
    return c


def prepare_checkpoint(binary, tmp):
    subprocess.run([binary, "train", "--run-dir", os.path.join(tmp, "ckpt"), "--quiet"] + T,
                   check=True, stdout=subprocess.DEVNULL)


def prepare_torn(binary, tmp):
    """A finished run whose metrics.jsonl then loses the end of its last line (what a crash
    mid-append left before appends were made whole)."""
    torn = os.path.join(tmp, "torn")
    subprocess.run([binary, "train", "--run-dir", torn, "--quiet", "--no-checkpoints"] + T,
                   check=True, stdout=subprocess.DEVNULL)
    path = os.path.join(torn, "metrics.jsonl")
    data = open(path, "rb").read().rstrip(b"\n")
    open(path, "wb").write(data[: len(data) - 20])


def row8(binary, tmp):
    """Two runs on one new run directory at once."""
    args = [binary, "train", "--run-dir", os.path.join(tmp, "r8"), "--epochs", "2",
            "--train-limit", "30000", "--test-limit", "128", "--threads", "1"]
    a = subprocess.Popen(args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(1.5)
    b = subprocess.run(args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    a.communicate()
    lines = [l for l in b.stdout.decode().splitlines() if l.startswith("error")]
    epochs = sum('"epoch"' in l and '"step"' not in l
                 for l in open(os.path.join(tmp, "r8", "metrics.jsonl")))
    return [("8", "two train --run-dir r8 at once (2 epochs)", f"first {a.returncode}, "
             f"second {b.returncode}", "", (lines[0] if lines else "") +
             f" [metrics.jsonl epoch lines: {epochs}]")]


def row9(binary, tmp):
    """A run on a nearly full 200 KiB tmpfs."""
    mnt = os.path.join(tmp, "full")
    os.mkdir(mnt)
    if os.geteuid() != 0:
        return [("9", "200 KiB tmpfs", "not run (needs root to mount)", "", "")]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", mnt], check=True)
    try:
        with open(os.path.join(mnt, "filler"), "wb") as f:
            f.write(b"\0" * (188 * 1024))
        code, rss, first, _ = run(binary, ["train", "--run-dir", os.path.join(mnt, "r"),
                                           "--log-every", "1", "--no-checkpoints",
                                           "--train-limit", "4096", "--test-limit", "128",
                                           "--epochs", "1", "--threads", "1"], tmp)
        metrics = os.path.join(mnt, "r", "metrics.jsonl")
        tail = open(metrics, "rb").read()[-1:] if os.path.exists(metrics) else b"(none)"
        rss = f"{int(rss) / 1024:.0f} MiB" if rss.isdigit() else rss
        return [("9", "train --run-dir TMPFS/r --log-every 1 --no-checkpoints $T", code, rss,
                 first + f" [metrics.jsonl ends with {tail!r}]")]
    finally:
        subprocess.run(["umount", mnt], check=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/dptrain")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    binary = os.path.abspath(a.bin)
    only = set(a.only.split(",")) if a.only else None
    tmp = tempfile.mkdtemp(prefix="dptrain-rows-")
    try:
        all_cases = cases(tmp)
        if only is None or "10" in only:
            prepare_torn(binary, tmp)
        if only is None or "14" in only or "msg" in only:
            prepare_checkpoint(binary, tmp)
        os.mkdir(os.path.join(tmp, "r12"))
        write(os.path.join(tmp, "r12", "thesis.99999.0.tmp"), "a user's file\n")
        print("| row | command | exit | peak RSS | first line of output |")
        print("|---|---|---|---|---|")
        for case in all_cases:
            row, shown, args = case[0], case[1], case[2]
            if only is not None and row not in only:
                continue
            tail = case[3] if len(case) > 3 else None
            code, rss, first, secs = run(binary, args, tmp, tail)
            extra = ""
            if row == "12":
                kept = os.path.exists(os.path.join(tmp, "r12", "thesis.99999.0.tmp"))
                extra = f" [thesis.99999.0.tmp {'kept' if kept else 'DELETED'}]"
            if row == "5":
                extra = f" [{secs:.1f} s]"
            rss_s = f"{int(rss) / 1024:.0f} MiB" if rss.isdigit() else rss
            print(f"| {row} | `{shown}` | {code} | {rss_s} | {first[:160]}{extra} |", flush=True)
        for extra_rows, needed in ((row8, "8"), (row9, "9")):
            if only is None or needed in only:
                for r in extra_rows(binary, tmp):
                    print("| " + " | ".join(str(x) for x in r) + " |", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

//! Issue 21, "every list and number option": each number and list option of every subcommand
//! at 0, negative, huge, NaN, with duplicate and empty entries and in odd order is refused
//! with a message naming the option (exit 2 for a value clap's parsers refuse, 1 for a
//! meaning the command refuses), or its meaning is said (a warning, or the help text). Every
//! refusal here comes before any data is loaded or anything is trained, so each case takes
//! milliseconds.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_dptrain");

fn dptrain(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// (arguments, exit code, text expected on stderr).
type Case = (&'static [&'static str], i32, &'static str);

/// Values clap's parsers refuse (exit 2): negatives (which used to be read as unknown flags),
/// exponents for counts, numbers past the type, NaN and infinities.
const PARSE_REFUSALS: &[Case] = &[
    (
        &["train", "--epochs", "-1"],
        2,
        "invalid value '-1' for '--epochs <EPOCHS>': a negative number",
    ),
    (
        &["train", "--batch", "1e30"],
        2,
        "for '--batch <BATCH>': not a whole number",
    ),
    (
        &["train", "--workers", "-1"],
        2,
        "for '--workers <WORKERS>': a negative number",
    ),
    (
        &["train", "--seed", "18446744073709551616"],
        2,
        "the largest allowed is 18446744073709551615",
    ),
    (
        &["train", "--warmup-steps", "-5"],
        2,
        "'--warmup-steps <WARMUP_STEPS>': a negative number",
    ),
    (
        &["train", "--train-limit", "1.5"],
        2,
        "'--train-limit <TRAIN_LIMIT>': not a whole number",
    ),
    (
        &["train", "--keep-checkpoints", "-1"],
        2,
        "'--keep-checkpoints <KEEP_CHECKPOINTS>'",
    ),
    (
        &["train", "--log-every", "99999999999999999999"],
        2,
        "too large",
    ),
    (
        &["train", "--lr", "NaN"],
        2,
        "'--lr <LR>': not a number (NaN)",
    ),
    (
        &["train", "--lr", "-1"],
        2,
        "'--lr <LR>': a negative number",
    ),
    (
        &["train", "--momentum", "inf"],
        2,
        "'--momentum <MOMENTUM>': infinite",
    ),
    (
        &["train", "--weight-decay", "1e39"],
        2,
        "'--weight-decay <WEIGHT_DECAY>': infinite",
    ),
    (
        &["train", "--comm-timeout", "-3"],
        2,
        "'--comm-timeout <COMM_TIMEOUT>': a negative number",
    ),
    (
        &["eval", "--checkpoint", "x", "--batch", "-1"],
        2,
        "'--batch <BATCH>': a negative",
    ),
    (
        &["predict", "--checkpoint", "x", "--top-k", "-2", "a.png"],
        2,
        "'--top-k <TOP_K>'",
    ),
    (
        &[
            "profile",
            "--model",
            "lenet5",
            "--out",
            "p.json",
            "--efficiency",
            "-1",
        ],
        2,
        "'--efficiency <EFFICIENCY>': a negative",
    ),
    (
        &["simulate", "--model", "lenet5", "--device-tflops", "NaN"],
        2,
        "'--device-tflops <DEVICE_TFLOPS>': not a number (NaN)",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--steps",
            "-1",
        ],
        2,
        "'--steps <STEPS>'",
    ),
    (
        &["model", "show", "lenet5", "--classes", "-1"],
        2,
        "'--classes <CLASSES>': a negative",
    ),
    (
        &["data", "pack", "d", "--out", "o", "--quality", "256"],
        2,
        "the largest allowed is 255",
    ),
    (
        &["data", "pack", "d", "--out", "o", "--max-side", "-1"],
        2,
        "'--max-side <MAX_SIDE>'",
    ),
    (
        &["bench", "allreduce", "--iters", "-1"],
        2,
        "'--iters <ITERS>': a negative",
    ),
    (
        &["bench", "step", "--batch", "1e3"],
        2,
        "'--batch <BATCH>': not a whole number",
    ),
    (
        &["bench", "sim-check", "--device-headroom", "inf"],
        2,
        "'--device-headroom <DEVICE_HEADROOM>': infinite",
    ),
    // A negative value of a text option reaches that option's parser too.
    (
        &["train", "--image-size", "-1"],
        1,
        "--image-size: bad image size '-1'",
    ),
];

/// Meanings the commands refuse (exit 1): zero counts, lists with empty or repeated entries,
/// schedules out of order.
const MEANING_REFUSALS: &[Case] = &[
    (
        &[
            "train",
            "--emulate-device",
            "p.json",
            "--emulate-device-scale",
            "1e300",
        ],
        1,
        "--emulate-device-scale must be a positive number up to 1e6, not 1e300",
    ),
    (
        &["train", "--comm-timeout", "1e-300"],
        1,
        "--comm-timeout must be a number of seconds from 0.001 (1 ms) to 31536000 (a year), not \
         1e-300",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-images-per-s",
            "1e300",
        ],
        1,
        "--device-images-per-s 1e300: at batch 32 a step of 3.200e-296 ms",
    ),
    // A negative link value is read as a value (not an unknown flag) and refused as negative.
    (
        &[
            "train",
            "--link-bandwidth",
            "1Gbit",
            "--link-latency",
            "-5us",
        ],
        1,
        "--link-latency: invalid duration \"-5us\": must be >= 0",
    ),
    (
        &["train", "--link-latency", "-5us"],
        1,
        "--link-latency: invalid duration \"-5us\": must be >= 0",
    ),
    (
        &["bench", "allreduce", "--link-latency", "1e400s"],
        1,
        "--link-latency: invalid duration \"1e400s\": too large",
    ),
    (
        &["train", "--link-bandwidth", "-1Gbit"],
        1,
        "--link-bandwidth: invalid bandwidth \"-1Gbit\": must be a positive number",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--step-overhead",
            "-1ms",
        ],
        1,
        "--step-overhead: invalid duration \"-1ms\": must be >= 0",
    ),
    (
        &["bench", "overlap", "--link-bandwidth", "none,-20Mbit"],
        1,
        "--link-bandwidth: invalid bandwidth \"-20Mbit\"",
    ),
    (
        &[
            "bench",
            "allreduce",
            "--link-bandwidth",
            "1Gbit",
            "--link-latency",
            "-1us",
        ],
        1,
        "--link-latency: invalid duration \"-1us\"",
    ),
    (
        &[
            "bench",
            "sim-check",
            "--cluster-bandwidth",
            "100mbit,-1mbit",
        ],
        1,
        "--cluster-bandwidth -1mbit: invalid bandwidth",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--mem-gbs",
            "1e-300",
        ],
        1,
        "the device given (flops: 1 TFLOPS x 0.4 efficiency, 1e-300 GB/s memory) makes an \
         impossible profile of lenet5 at batch 32",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--compute-spread",
            "20",
        ],
        1,
        "--compute-spread 20: at most 1",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "10",
            "--comm",
            "tree",
            "--workers",
            "18446744073709551615",
        ],
        1,
        "--workers: 18446744073709551615 workers is more than the 16777216",
    ),
    (
        &[
            "profile",
            "--model",
            "lenet5",
            "--steps",
            "4611686018427387904",
            "--out",
            "p.json",
        ],
        1,
        "--steps 4611686018427387904: at most 10000 timed steps",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--workers",
            "8",
            "--devices-per-host",
            "4",
            "--intra-bandwidth",
            "none",
        ],
        1,
        "--intra-bandwidth none: with --devices-per-host 4 the simulator prices the link",
    ),
    (
        &["train", "--schedule", "fifo"],
        1,
        "--schedule must be overlap or priority, not \"fifo\"",
    ),
    (
        &["train", "--schedule", "priority", "--partition-kb", "0"],
        1,
        "--partition-kb 0: a partition must hold at least 1 KiB",
    ),
    (
        &["train", "--schedule", "priority", "--credit-kb", "0"],
        1,
        "--credit-kb 0: a decision commits to at least 1 KiB",
    ),
    (
        &["train", "--credit-kb", "64"],
        1,
        "--credit-kb 64 applies to --schedule priority",
    ),
    (
        &["train", "--schedule", "priority", "--overlap", "off"],
        1,
        "--schedule priority with --overlap off",
    ),
    (
        &["train", "--schedule", "priority", "--comm", "tree"],
        1,
        "--schedule priority with --comm tree",
    ),
    (
        &["train", "--schedule", "priority", "--on-nonfinite", "skip"],
        1,
        "--schedule priority with --on-nonfinite skip",
    ),
    (
        &["train", "--compress", "zstd"],
        1,
        "--compress must be none, fp16 or bf16, not \"zstd\"",
    ),
    (
        &[
            "train",
            "--workers",
            "2",
            "--comm",
            "shm",
            "--compress",
            "fp16",
        ],
        1,
        "--compress fp16 with --comm shm: the shared-memory collective sends no messages",
    ),
    (
        &["train", "--epochs", "0"],
        1,
        "--epochs must be at least 1",
    ),
    (
        &["train", "--workers", "0"],
        1,
        "--workers must be at least 1",
    ),
    (
        &["train", "--threads", "0"],
        1,
        "--threads must be at least 1",
    ),
    (
        &["train", "--batch", "0"],
        1,
        "--batch 0 must be a positive multiple",
    ),
    (
        &["train", "--keep-checkpoints", "0"],
        1,
        "--keep-checkpoints 0",
    ),
    (&["train", "--train-limit", "0"], 1, "--train-limit 0"),
    (
        &["train", "--loader-threads", "99999999999"],
        1,
        "--loader-threads must be 1..=64",
    ),
    (
        &["train", "--prefetch", "99999999999"],
        1,
        "--prefetch must be at most",
    ),
    (
        &["train", "--momentum", "1e30"],
        1,
        "--momentum must be in [0, 1)",
    ),
    (
        &["train", "--lr-schedule", "step:2,2"],
        1,
        "milestone 2 does not come after 2 (a repeated milestone would apply gamma twice",
    ),
    (
        &["train", "--lr-schedule", "step:5,2"],
        1,
        "milestone 2 does not come after 5 (milestones go in increasing order)",
    ),
    (
        &["train", "--lr-schedule", "step:0"],
        1,
        "milestone 0 would lower the rate before the first epoch",
    ),
    (
        &["train", "--lr-schedule", "step:2,,3"],
        1,
        "milestone '' is not a whole number",
    ),
    (
        &["train", "--lr-schedule", "step:2,"],
        1,
        "milestone '' is not a whole number",
    ),
    (
        &["train", "--lr-schedule", "step:2:5"],
        1,
        "gamma 5 is outside (0, 1]",
    ),
    (
        &["train", "--lr-schedule", "step:2:0"],
        1,
        "gamma 0 is outside (0, 1]",
    ),
    (
        &["train", "--augment", "flip,"],
        1,
        "--augment: unknown or malformed transform ''",
    ),
    (
        &["train", "--augment", "crop:0"],
        1,
        "crop padding 0 must be 1..=64",
    ),
    (
        &["train", "--image-size", "0"],
        1,
        "a side of 0 is outside 1..=4096",
    ),
    (
        &["train", "--trace", "t.json", "--trace-steps", "8..5"],
        1,
        "--trace-steps: bad step window '8..5'",
    ),
    (
        &["simulate", "--profile", "p.json", "--device-tflops", "1"],
        1,
        "--device-tflops applies with --model",
    ),
    (
        &["simulate", "--profile", "p.json", "--batch", "8"],
        1,
        "--batch applies with --model",
    ),
    (
        &["train", "--data-dir", "/no/such/mnist"],
        1,
        "/no/such/mnist: not found; `--dataset mnist` with a directory reads",
    ),
    (
        &[
            "bench",
            "allreduce",
            "--sizes",
            "4K",
            "--iters",
            "1",
            "--link-bandwidth",
            "1bit",
        ],
        1,
        "moves a 4096-byte message (of the 4096-byte buffer)",
    ),
    (
        &[
            "bench",
            "allreduce",
            "--sizes",
            "4K",
            "--iters",
            "1",
            "--link-bandwidth",
            "1Gbit",
            "--link-latency",
            "200s",
        ],
        1,
        "--link-latency 200 s is not below the 120 s timeout",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-images-per-s",
            "100",
            "--efficiency",
            "0.5",
        ],
        1,
        "--efficiency is the fraction of --device-tflops reached",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--intra-latency",
            "5us",
        ],
        1,
        "with --devices-per-host 1 there is none",
    ),
    (
        &[
            "profile",
            "--model",
            "lenet5",
            "--out",
            "p.json",
            "--mem-gbs",
            "100",
        ],
        1,
        "--mem-gbs is the device's memory bandwidth",
    ),
    (
        &[
            "profile",
            "--model",
            "lenet5",
            "--out",
            "p.json",
            "--device-tflops",
            "1",
            "--steps",
            "3",
        ],
        1,
        "--steps is an option of a measured profile",
    ),
    (
        &["simulate"],
        1,
        "give --profile FILE, or --model with a device speed",
    ),
    (&["train", "--augment", ""], 1, "an empty list"),
    (
        &["eval", "--checkpoint", "x", "--workers", "257"],
        1,
        "eval runs at most 256 workers",
    ),
    (
        &["train", "--normalize", "0.5/0"],
        1,
        "every deviation must be > 0",
    ),
    (
        &["eval", "--checkpoint", "x", "--threads", "0"],
        1,
        "--threads 0: a forward needs at least 1",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--credit-kb",
            "64",
        ],
        1,
        "--credit-kb 64 applies to --schedule priority",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--schedule",
            "priority",
            "--credit-kb",
            "0",
        ],
        1,
        "--credit-kb 0: a decision commits to at least 1 KiB",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--workers",
            "2,2",
        ],
        1,
        "--workers \"2,2\": '2' is given twice",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--workers",
            "2,,4",
        ],
        1,
        "--workers \"2,,4\": an empty entry",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--workers",
            "",
        ],
        1,
        "--workers \"\": an empty entry",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--workers",
            "0",
        ],
        1,
        "bad worker count '0'",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--comm",
            "ring,ring",
        ],
        1,
        "--comm \"ring,ring\": 'ring' is given twice",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--devices-per-host",
            "0",
        ],
        1,
        "--devices-per-host 0",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--efficiency",
            "2",
        ],
        1,
        "--efficiency 2: must be in (0, 1]",
    ),
    (
        &[
            "profile",
            "--model",
            "lenet5",
            "--out",
            "p.json",
            "--device-images-per-s",
            "0",
        ],
        1,
        "--device-images-per-s 0: must be a finite number above 0",
    ),
    (
        &[
            "profile", "--model", "lenet5", "--out", "p.json", "--steps", "0",
        ],
        1,
        "at least 1",
    ),
    (
        &["bench", "allreduce", "--sizes", "4K,4096"],
        1,
        "--sizes \"4K,4096\": '4096' repeats an earlier entry",
    ),
    (
        &["bench", "allreduce", "--sizes", "4K,,8K"],
        1,
        "--sizes \"4K,,8K\": an empty entry",
    ),
    (
        &["bench", "allreduce", "--sizes", "-1"],
        1,
        "--sizes: bad size '-1'",
    ),
    (
        &["bench", "allreduce", "--sizes", "99999999999G"],
        1,
        "--sizes: bad size '99999999999G'",
    ),
    (
        &["bench", "allreduce", "--comm", "auto,auto"],
        1,
        "--comm \"auto,auto\": 'auto' is given twice",
    ),
    (
        &["bench", "allreduce", "--iters", "0"],
        1,
        "--iters 0: give a count from 1 to",
    ),
    (
        &["bench", "step", "--threads", "2,1,2"],
        1,
        "--threads \"2,1,2\": '2' is given twice",
    ),
    (
        &["bench", "step", "--model", "lenet5,"],
        1,
        "--model \"lenet5,\": an empty entry",
    ),
    (
        &["bench", "infer", "--model", "lenet5,lenet5"],
        1,
        "'lenet5' is given twice",
    ),
    (
        &[
            "bench",
            "step",
            "--model",
            "lenet5",
            "--threads",
            "1,100000",
        ],
        1,
        "--threads 100000: at most",
    ),
    (
        &["bench", "infer", "--model", "lenet5", "--threads", "100000"],
        1,
        "--threads 100000: at most",
    ),
    (
        &["bench", "data", "--loader-threads", "1,1"],
        1,
        "--loader-threads \"1,1\"",
    ),
    (
        &["bench", "data", "--batches", "0"],
        1,
        "--batches 0: give a count from 1 to",
    ),
    (
        &[
            "bench",
            "loader",
            "--imagefolder",
            "/nonexistent",
            "--reps",
            "0",
        ],
        1,
        "--reps 0: give a count from 1 to",
    ),
    (
        &["bench", "ablation", "--sim-workers", "8,8"],
        1,
        "--sim-workers \"8,8\": '8' is given twice",
    ),
    (
        &["bench", "ablation", "--sim-workers", "8,"],
        1,
        "--sim-workers \"8,\": an empty entry",
    ),
    (
        &["bench", "sim-check", "--model", "lenet5,lenet5"],
        1,
        "'lenet5' is given twice",
    ),
    (
        &["bench", "sim-check", "--link-bandwidth", "1Gbit,"],
        1,
        "--link-bandwidth \"1Gbit,\": an empty entry",
    ),
    (
        &["bench", "sim-check", "--device-headroom", "0"],
        1,
        "--device-headroom must be at least 1",
    ),
    // Every measured profile is held to the compute threads a benchmark's may run, over all
    // its replicas, before anything is measured (profile's 100000 threads aborted like
    // bench step's; sim-check and the ablation measured their workers unchecked).
    (
        &[
            "profile",
            "--model",
            "lenet5",
            "--out",
            "p.json",
            "--threads",
            "100000",
        ],
        1,
        "--threads 100000: at most",
    ),
    (
        &[
            "profile",
            "--model",
            "lenet5",
            "--out",
            "p.json",
            "--threads",
            "1000",
            "--concurrent",
            "1000",
        ],
        1,
        "1000 compute threads (--threads) x 1000 replicas (--concurrent): at most",
    ),
    (
        &[
            "bench",
            "sim-check",
            "--against",
            "emulated",
            "--workers",
            "300",
            "--batch",
            "300",
        ],
        1,
        "--workers 300 is more than the 256 workers one process runs",
    ),
    (
        &["bench", "ablation", "--workers", "300", "--batch", "300"],
        1,
        "--workers 300 is more than the 256 workers one process runs",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--link-bandwidth",
            "0.5bit",
        ],
        1,
        "too small a number, below 1 bit/s",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--nic-efficiency",
            "1e-300",
        ],
        1,
        "--nic-efficiency 1e-300: give the fraction of the line rate delivered, from 0.01 to 1",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--partition-kb",
            "4",
        ],
        1,
        "the simulator models partitions under --schedule priority only",
    ),
    (
        &["train", "--link-bandwidth", "2000TB/s"],
        1,
        "too large a number, above 1 PB/s",
    ),
    (
        &["bench", "sim-check", "--rounds", "0"],
        1,
        "--rounds 0: give a count from 1 to",
    ),
    (
        &[
            "bench",
            "sim-check",
            "--against",
            "cluster",
            "--schedule",
            "overlap,fifo",
        ],
        1,
        "--schedule must be overlap or priority, not \"fifo\"",
    ),
    (
        &["bench", "overlap", "--steps", "0"],
        1,
        "--steps 0: give a count from 1 to",
    ),
    (
        &["bench", "overlap", "--link-bandwidth", "none,none"],
        1,
        "'none' is given twice",
    ),
    (
        &["data", "export-images", "--out", "ex", "--limit", "0"],
        1,
        "--limit 0 exports nothing",
    ),
    // The weights file only has to exist: the list is refused before it is read.
    (
        &["train", "--weights", BIN, "--reinit", "fc3,fc3"],
        1,
        "--reinit 'fc3,fc3': layer 'fc3' is named twice",
    ),
    (
        &["train", "--weights", BIN, "--reinit", "fc3,"],
        1,
        "--reinit 'fc3,': give layer names",
    ),
    (
        &[
            "simulate",
            "--model",
            "lenet5",
            "--device-tflops",
            "1",
            "--steps",
            "99999999999",
        ],
        1,
        "--steps 99999999999: at most 10000",
    ),
    (
        &["bench", "loader", "--packed", "a,a"],
        1,
        "--packed: \"a\" is empty or given twice",
    ),
    (
        &["bench", "loader", "--packed", "a,"],
        2,
        "a value is required for '--packed <PACKED>'",
    ),
];

fn check(cases: &[Case]) {
    let dir = tempfile::tempdir().unwrap();
    let mut failed = Vec::new();
    for &(args, code, want) in cases {
        let o = dptrain(args, dir.path());
        let err = String::from_utf8_lossy(&o.stderr);
        if o.status.code() != Some(code) || !err.contains(want) {
            failed.push(format!(
                "{args:?}: exit {:?} (want {code}), stderr {err:?} (want {want:?})",
                o.status.code()
            ));
        }
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn values_the_parsers_refuse_name_the_option_and_the_value() {
    check(PARSE_REFUSALS);
}

#[test]
fn meanings_the_commands_refuse_are_said() {
    check(MEANING_REFUSALS);
}

#[test]
fn a_milestone_past_the_run_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let o = dptrain(
        &[
            "train",
            "--lr-schedule",
            "step:1,5",
            "--trace-steps",
            "1..3",
            "--epochs",
            "1",
            "--train-limit",
            "64",
            "--test-limit",
            "64",
            "--no-checkpoints",
            "--quiet",
            "--run-dir",
            "run",
        ],
        dir.path(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("milestone 1 is not before the last epoch")
            && err.contains("milestone 5 is not before the last epoch")
            && err.contains("no --trace is given: nothing is traced"),
        "{err}"
    );
}

/// Values accepted with a meaning: the help says what it is.
#[test]
fn accepted_values_say_their_meaning_in_the_help() {
    let dir = tempfile::tempdir().unwrap();
    let help = |args: &[&str]| {
        let o = dptrain(args, dir.path());
        assert_eq!(o.status.code(), Some(0));
        // Help lines wrap differently with the terminal: compare with whitespace squeezed.
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let train = help(&["train", "--help"]);
    for meaning in [
        "0 (or more than --epochs) for only the last",
        "one longer than the run never reaches --lr",
        "more than written keeps all",
        "more than an epoch's steps: per epoch only",
        "more than the dataset has: all of it",
        "0 for one block per bucket",
    ] {
        assert!(train.contains(meaning), "train --help lacks {meaning:?}");
    }
    assert!(help(&["simulate", "--help"]).contains("one row each in the order given"));
}

/// Every `--model` (and `model show`'s MODEL) says the same: the built-ins are what `dptrain
/// model list` lists, and a model file is accepted; the old list of three names is gone.
#[test]
fn every_model_option_names_the_builtins_and_model_files_alike() {
    let dir = tempfile::tempdir().unwrap();
    for cmd in [
        &["train"][..],
        &["profile"],
        &["simulate"],
        &["model", "show"],
        &["bench", "step"],
        &["bench", "infer"],
        &["bench", "data"],
        &["bench", "ablation"],
        &["bench", "sim-check"],
        &["bench", "overlap"],
    ] {
        let mut args = cmd.to_vec();
        args.push("--help");
        let o = dptrain(&args, dir.path());
        let text: String = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            text.contains("(`dptrain model list`) or")
                && text.contains("model file")
                && !text.contains("vgg-small or resnet20"),
            "{cmd:?} --help: {text}"
        );
    }
}

#[test]
fn simulate_checks_every_worker_count_before_printing_a_row() {
    let dir = tempfile::tempdir().unwrap();
    let o = dptrain(
        &[
            "simulate",
            "--model",
            "resnet20",
            "--device-tflops",
            "10",
            "--workers",
            "8,12",
            "--devices-per-host",
            "8",
            "--intra-bandwidth",
            "10GB/s",
        ],
        dir.path(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("12 workers are not whole hosts of 8 devices"),
        "{err}"
    );
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // Every flag is read before the table starts (the header was printed before these).
    let common = ["simulate", "--model", "lenet5", "--device-tflops", "1"];
    for (extra, want) in [
        (&["--hierarchical", "foo"][..], "--hierarchical must be"),
        (&["--overlap", "on,off"][..], "overlap"),
        (
            &["--search-schedule", "--schedule", "priority"][..],
            "--schedule with --search-schedule",
        ),
        (
            &["--search-schedule", "--partition-kb", "64"][..],
            "--partition-kb with --search-schedule",
        ),
    ] {
        let o = dptrain(&[&common[..], extra].concat(), dir.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(
            o.stdout.is_empty(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}

#[test]
fn simulate_bounds_the_messages_of_a_configuration_over_its_steps() {
    let dir = tempfile::tempdir().unwrap();
    let args = |steps: &'static str| {
        [
            "simulate",
            "--model",
            "resnet20",
            "--device-images-per-s",
            "1000",
            "--workers",
            "100000",
            "--comm",
            "tree",
            "--hierarchical",
            "off",
            "--overlap",
            "on",
            "--steps",
            steps,
        ]
    };
    // 10000 steps of a 2.2-million-message step (about 40 minutes) is refused at once, naming
    // the steps that fit; those run.
    let o = dptrain(&args("10000"), dir.path());
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let fit: usize = out
        .split("give --steps ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!((20..10000).contains(&fit), "{out}");
}

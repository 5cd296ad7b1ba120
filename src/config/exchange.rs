//! How a run's workers combine and send their gradients, as its options gave it: the
//! workers it ran on, the communication mode and hierarchy, compression, buckets, schedule,
//! partitions and credit, the emulated links, and what a non-finite gradient does. These
//! decide the bits of every sum (a mode's order of addition, a bucket's chunks, PowerSGD's
//! error feedback) and how long a step takes, so a checkpoint records them (metadata key
//! `exchange`, JSON; absent in older checkpoints) and a resume not given them takes them
//! from it (`crate::train::follow`): `--resume CK` alone continues a run of `--workers 2
//! --comm ring --compress powersgd:4` as that, not as one worker sending f32.
//!
//! Recorded as given, not as resolved: a value left to its default (a bucket cap from the
//! link, `auto`'s choice per bucket) is resolved again from the same recorded options, so a
//! resume resolves it as the run did, and a value never given is never imposed.

use super::TrainOptions;
use serde::{Deserialize, Serialize};

/// Generates [`Exchange`] from the list of its options (each a `TrainOptions` field of the
/// same name and type): one list, so recording and following cannot disagree on which.
macro_rules! exchange_options {
    ($($(#[doc = $doc:literal])* $field:ident: $ty:ty,)*) => {
        /// A run's gradient exchange as its options gave it (see the module comment).
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "kebab-case")]
        pub struct Exchange {
            /// Workers per process, as resolved (`--workers`; the run's workers in all are
            /// the checkpoint's `world`).
            pub workers: usize,
            $(
                $(#[doc = $doc])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $field: Option<$ty>,
            )*
        }

        impl Exchange {
            /// The exchange `options` give, on `workers` workers per process.
            pub fn of(options: &TrainOptions, workers: usize) -> Self {
                Self { workers, $( $field: options.$field.clone(), )* }
            }

            /// The recorded options (but `--workers`) that `given` leaves out and `applies`
            /// accepts (flag without `--`, value), set in `into`; returns them as flags
            /// (`--comm ring`).
            pub fn lay_under(
                &self,
                given: &TrainOptions,
                into: &mut TrainOptions,
                applies: impl Fn(&str, &str) -> bool,
            ) -> Vec<String> {
                let mut taken = Vec::new();
                $(
                    if let (None, Some(value)) = (&given.$field, &self.$field) {
                        let flag = stringify!($field).replace('_', "-");
                        let text = value.to_string();
                        if applies(&flag, &text) {
                            taken.push(format!("--{flag} {text}"));
                            into.$field = Some(value.clone());
                        }
                    }
                )*
                taken
            }
        }
    };
}

exchange_options! {
    /// `--overlap`.
    overlap: String,
    /// `--comm`.
    comm: String,
    /// `--hierarchical`.
    hierarchical: String,
    /// `--compress`.
    compress: String,
    /// `--bucket-kb`.
    bucket_kb: usize,
    /// `--first-bucket-kb`.
    first_bucket_kb: usize,
    /// `--schedule`.
    schedule: String,
    /// `--partition-kb`.
    partition_kb: usize,
    /// `--credit-kb`.
    credit_kb: usize,
    /// `--link-bandwidth`.
    link_bandwidth: String,
    /// `--link-latency`.
    link_latency: String,
    /// `--intra-bandwidth`.
    intra_bandwidth: String,
    /// `--intra-latency`.
    intra_latency: String,
    /// `--on-nonfinite`.
    on_nonfinite: String,
}

impl Exchange {
    /// As the checkpoint's metadata entry `exchange` holds it.
    pub fn to_metadata(&self) -> String {
        serde_json::to_string(self).expect("an Exchange is plain strings and numbers")
    }

    /// Reads the metadata entry back; what does not read (an edited file) is named.
    pub fn from_metadata(text: &str) -> Result<Self, String> {
        serde_json::from_str(text)
            .map_err(|e| format!("metadata 'exchange' does not read back ({e})"))
    }

    /// Whether the recorded option `flag` (without `--`) with `value` means the same in a
    /// resume in one process (`one_process`) or over MPI: a process's own port and the
    /// hierarchy across processes exist only over MPI, MPI's all-reduce only there, and
    /// memory shared by every worker only in one process. Those are left to the resume's
    /// defaults rather than refuse it.
    pub fn applies(flag: &str, value: &str, one_process: bool) -> bool {
        match flag {
            "intra-bandwidth" | "intra-latency" | "hierarchical" => !one_process,
            "comm" if value == "mpi-native" => !one_process,
            "comm" if value == "shm" => one_process,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_run_was_given_is_recorded_and_laid_under_what_a_resume_leaves_out() {
        let run = TrainOptions {
            comm: Some("ring".into()),
            compress: Some("powersgd:2".into()),
            bucket_kb: Some(64),
            intra_bandwidth: Some("12GB/s".into()),
            ..Default::default()
        };
        let recorded = Exchange::of(&run, 2);
        let text = recorded.to_metadata();
        // Only what was given is written, and it reads back as it was.
        assert!(!text.contains("schedule"), "{text}");
        assert_eq!(Exchange::from_metadata(&text).unwrap(), recorded);
        assert!(Exchange::from_metadata(r#"{"workers":2,"comm":3}"#).is_err());
        assert!(Exchange::from_metadata(r#"{"workers":2,"threads":"4"}"#).is_err());

        let given = TrainOptions {
            compress: Some("none".into()),
            ..Default::default()
        };
        let mut into = TrainOptions::default();
        let taken = recorded.lay_under(&given, &mut into, |f, v| Exchange::applies(f, v, true));
        // The given compression wins; the port within a process is not one process's.
        assert_eq!(taken, ["--comm ring", "--bucket-kb 64"]);
        assert_eq!(into.comm.as_deref(), Some("ring"));
        assert_eq!((into.compress, into.intra_bandwidth), (None, None));
        let mut over_mpi = TrainOptions::default();
        let taken =
            recorded.lay_under(&given, &mut over_mpi, |f, v| Exchange::applies(f, v, false));
        assert_eq!(
            taken,
            ["--comm ring", "--bucket-kb 64", "--intra-bandwidth 12GB/s"]
        );
        assert!(!Exchange::applies("comm", "mpi-native", true));
        assert!(!Exchange::applies("comm", "shm", false));
    }
}

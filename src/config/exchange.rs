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
    ($($(#[doc = $doc:literal])* $field:ident: $ty:ty => $group:ident,)*) => {
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

            /// The recorded options (but `--workers`) of the groups ([`Group`]) that `given`
            /// gives none of and `applies` accepts (group, value), set in `into`; returns
            /// them as flags (`--comm ring`).
            pub fn lay_under(
                &self,
                given: &TrainOptions,
                into: &mut TrainOptions,
                applies: impl Fn(Group, &str) -> bool,
            ) -> Vec<String> {
                let mut taken = Vec::new();
                $(
                    if let Some(value) = &self.$field {
                        let flag = stringify!($field).replace('_', "-");
                        let text = value.to_string();
                        if !Self::group_given(given, Group::$group)
                            && applies(Group::$group, &text)
                        {
                            taken.push(format!("--{flag} {text}"));
                            into.$field = Some(value.clone());
                        }
                    }
                )*
                taken
            }

            /// Whether `given` gives an option of `group`.
            fn group_given(given: &TrainOptions, group: Group) -> bool {
                false $( || (Group::$group == group && given.$field.is_some()) )*
            }

            /// Whether every option (but `--workers`) is set: in a run's own exchange, each
            /// was given, and a resume takes none from its checkpoint's.
            pub fn is_whole(&self) -> bool {
                true $( && self.$field.is_some() )*
            }
        }
    };
}

/// Options that mean something only together: a resume that gives one of a group takes
/// none of the group from the record (`--link-bandwidth none` drops the run's latency too,
/// `--schedule overlap` its credit), so a recorded value never holds on to a partner the
/// resume has changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// `--overlap`.
    Overlap,
    /// `--comm`.
    Comm,
    /// `--hierarchical`.
    Hierarchy,
    /// `--compress`.
    Compress,
    /// The bucket caps.
    Buckets,
    /// `--schedule` with its partitions and credit.
    Schedule,
    /// The emulated link of every worker.
    Link,
    /// The emulated port within a process.
    IntraLink,
    /// `--on-nonfinite`.
    NonFinite,
}

exchange_options! {
    /// `--overlap`.
    overlap: String => Overlap,
    /// `--comm`.
    comm: String => Comm,
    /// `--hierarchical`.
    hierarchical: String => Hierarchy,
    /// `--compress`.
    compress: String => Compress,
    /// `--bucket-kb`.
    bucket_kb: usize => Buckets,
    /// `--first-bucket-kb`.
    first_bucket_kb: usize => Buckets,
    /// `--schedule`.
    schedule: String => Schedule,
    /// `--partition-kb`.
    partition_kb: usize => Schedule,
    /// `--credit-kb`.
    credit_kb: usize => Schedule,
    /// `--link-bandwidth`.
    link_bandwidth: String => Link,
    /// `--link-latency`.
    link_latency: String => Link,
    /// `--intra-bandwidth`.
    intra_bandwidth: String => IntraLink,
    /// `--intra-latency`.
    intra_latency: String => IntraLink,
    /// `--on-nonfinite`.
    on_nonfinite: String => NonFinite,
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

    /// Whether a recorded option of `group` with `value` means
    /// something in a resume given `given` (in one process where `one_process`, else over
    /// MPI): a process's own port and the hierarchy across processes exist only over MPI,
    /// MPI's all-reduce only there, and memory shared by every worker only in one process;
    /// and `--comm shm` given has no use for an emulated link or compression (it sends no
    /// messages). Those are left to the resume's defaults rather than refuse it.
    pub fn applies(group: Group, value: &str, given: &TrainOptions, one_process: bool) -> bool {
        let shm_given = given.comm.as_deref() == Some("shm");
        match group {
            Group::IntraLink | Group::Hierarchy => !one_process,
            Group::Link | Group::Compress => !shm_given,
            Group::Comm if value == "mpi-native" => !one_process,
            Group::Comm if value == "shm" => one_process,
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
            first_bucket_kb: Some(8),
            link_bandwidth: Some("1Gbit".into()),
            link_latency: Some("5us".into()),
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

        let follow = |given: &TrainOptions, one_process: bool| {
            let mut into = TrainOptions::default();
            let taken = recorded.lay_under(given, &mut into, |group, value| {
                Exchange::applies(group, value, given, one_process)
            });
            (taken, into)
        };
        // The given compression wins; one bucket cap given takes neither of the run's, the
        // bandwidth given none neither of its link; the port within a process is not one
        // process's.
        let given = TrainOptions {
            compress: Some("none".into()),
            bucket_kb: Some(32),
            link_bandwidth: Some("none".into()),
            ..Default::default()
        };
        let (taken, into) = follow(&given, true);
        assert_eq!(taken, ["--comm ring"]);
        assert_eq!(into.comm.as_deref(), Some("ring"));
        assert_eq!((into.compress, into.first_bucket_kb), (None, None));
        assert_eq!((into.link_latency, into.intra_bandwidth), (None, None));
        let (taken, _) = follow(&TrainOptions::default(), false);
        assert_eq!(
            taken,
            [
                "--comm ring",
                "--compress powersgd:2",
                "--bucket-kb 64",
                "--first-bucket-kb 8",
                "--link-bandwidth 1Gbit",
                "--link-latency 5us",
                "--intra-bandwidth 12GB/s"
            ]
        );
        // --comm shm given: no link, nothing to compress.
        let shm = TrainOptions {
            comm: Some("shm".into()),
            ..Default::default()
        };
        assert_eq!(
            follow(&shm, true).0,
            ["--bucket-kb 64", "--first-bucket-kb 8"]
        );
        let none = TrainOptions::default();
        assert!(!Exchange::applies(Group::Comm, "mpi-native", &none, true));
        assert!(!Exchange::applies(Group::Comm, "shm", &none, false));
        assert!(!Exchange::of(&given, 1).is_whole());
    }
}

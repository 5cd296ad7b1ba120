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

            /// The recorded options (but `--workers`) of each group ([`Group`]) that `given`
            /// gives none of, where `applies` accepts them (group, value), in the order of
            /// the list: each group's options set (the others unset) and as flags
            /// (`--comm ring`).
            pub fn groups_to_take(
                &self,
                given: &TrainOptions,
                applies: impl Fn(Group, &str) -> bool,
            ) -> Vec<TakenGroup> {
                let mut groups: Vec<TakenGroup> = Vec::new();
                $(
                    if let Some(value) = &self.$field {
                        let flag = stringify!($field).replace('_', "-");
                        let text = value.to_string();
                        let group = Group::$group;
                        if !Self::group_given(given, group) && applies(group, &text) {
                            let at = match groups.iter().position(|g| g.group == group) {
                                Some(at) => at,
                                None => {
                                    groups.push(TakenGroup::new(group));
                                    groups.len() - 1
                                }
                            };
                            groups[at].flags.push(format!("--{flag} {text}"));
                            groups[at].options.$field = Some(value.clone());
                        }
                    }
                )*
                groups
            }

            /// This record with `kept`'s options where it has none of its own: the groups
            /// a resume keeps without following them (`crate::train::follow`).
            pub fn keeping(mut self, kept: &TrainOptions) -> Self {
                $(
                    if self.$field.is_none() {
                        self.$field = kept.$field.clone();
                    }
                )*
                self
            }

            /// The recorded options that `given` leaves out but whose group it gives an
            /// option of, as flags: set aside with their group (to be said).
            pub fn set_aside(&self, given: &TrainOptions) -> Vec<String> {
                let mut flags = Vec::new();
                $(
                    if let (Some(value), None) = (&self.$field, &given.$field) {
                        if Self::group_given(given, Group::$group) {
                            let flag = stringify!($field).replace('_', "-");
                            flags.push(format!("--{flag} {value}"));
                        }
                    }
                )*
                flags
            }

            /// The options of each group, as flags (`--link-bandwidth`), in the order of the
            /// list: what a resume gives one of per group to take nothing from a record.
            pub fn flags_by_group() -> Vec<(Group, Vec<String>)> {
                let mut groups: Vec<(Group, Vec<String>)> = Vec::new();
                $(
                    let flag = format!("--{}", stringify!($field).replace('_', "-"));
                    match groups.iter_mut().find(|(g, _)| *g == Group::$group) {
                        Some((_, flags)) => flags.push(flag),
                        None => groups.push((Group::$group, vec![flag])),
                    }
                )*
                groups
            }

            /// Whether `given` gives an option of `group`.
            fn group_given(given: &TrainOptions, group: Group) -> bool {
                false $( || (Group::$group == group && given.$field.is_some()) )*
            }

            /// Whether `given` gives an option of every group that `applies` to the
            /// resume, so that it would take nothing from a record (one that does not read
            /// back, say).
            pub fn every_group_given(
                given: &TrainOptions,
                applies: impl Fn(Group) -> bool,
            ) -> bool {
                true $( && (Self::group_given(given, Group::$group) || !applies(Group::$group)) )*
            }
        }
    };
}

/// The options of one [`Group`] a resume takes from its checkpoint's record.
#[derive(Debug, Clone)]
pub struct TakenGroup {
    /// Which.
    pub group: Group,
    /// Its options set, the others unset (to be laid under the given ones).
    pub options: TrainOptions,
    /// The same as flags (`--link-bandwidth 1Gbit`), for the notes.
    pub flags: Vec<String>,
}

impl TakenGroup {
    fn new(group: Group) -> Self {
        Self {
            group,
            options: TrainOptions::default(),
            flags: Vec::new(),
        }
    }
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
    bucket_kb: super::KibOrAuto => Buckets,
    /// `--first-bucket-kb`.
    first_bucket_kb: super::KibOrAuto => Buckets,
    /// `--schedule`.
    schedule: String => Schedule,
    /// `--partition-kb`.
    partition_kb: super::KibOrAuto => Schedule,
    /// `--credit-kb`.
    credit_kb: super::KibOrAuto => Schedule,
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

    /// Reads the metadata entry back, of a run of `world` workers in all; what does not read
    /// (an edited file) is named, as are workers per process that do not divide the world
    /// (no grouping of processes has them, so a resume would not know what to follow).
    pub fn from_metadata(text: &str, world: usize) -> Result<Self, String> {
        let read: Self = serde_json::from_str(text)
            .map_err(|e| format!("metadata 'exchange' does not read back ({e})"))?;
        match read.workers {
            w if w >= 1 && world.is_multiple_of(w) => Ok(read),
            w => Err(format!(
                "metadata 'exchange' records {w} workers per process, which do not divide the \
                 run's {world} workers"
            )),
        }
    }

    /// Whether a recorded option of `group` (with `value`, where known) means something in
    /// a resume in one process (`one_process`) or over MPI: a process's own port and the
    /// hierarchy across processes exist only over MPI, MPI's all-reduce only there, and
    /// memory shared by every worker only in one process. Those are left to the resume's
    /// defaults rather than refuse it. (What conflicts with an option the resume gives is
    /// judged by resolving the options with and without it: `cli::train`.)
    pub fn applies(group: Group, value: Option<&str>, one_process: bool) -> bool {
        match (group, value) {
            (Group::IntraLink | Group::Hierarchy, _) => !one_process,
            (Group::Comm, Some("mpi-native")) => !one_process,
            (Group::Comm, Some("shm")) => one_process,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_group_lists_its_flags_in_the_order_of_the_list() {
        let groups = Exchange::flags_by_group();
        let link = groups.iter().find(|(g, _)| *g == Group::Link).unwrap();
        assert_eq!(link.1, ["--link-bandwidth", "--link-latency"]);
        let schedule = groups.iter().find(|(g, _)| *g == Group::Schedule).unwrap();
        assert_eq!(schedule.1, ["--schedule", "--partition-kb", "--credit-kb"]);
    }

    #[test]
    fn what_a_run_was_given_is_recorded_and_laid_under_what_a_resume_leaves_out() {
        let run = TrainOptions {
            comm: Some("ring".into()),
            compress: Some("powersgd:2".into()),
            bucket_kb: Some(64.into()),
            first_bucket_kb: Some(8.into()),
            link_bandwidth: Some("1Gbit".into()),
            link_latency: Some("5us".into()),
            intra_bandwidth: Some("12GB/s".into()),
            ..Default::default()
        };
        let recorded = Exchange::of(&run, 2);
        let text = recorded.to_metadata();
        // Only what was given is written, and it reads back as it was.
        assert!(!text.contains("schedule"), "{text}");
        assert_eq!(Exchange::from_metadata(&text, 4).unwrap(), recorded);
        assert!(Exchange::from_metadata(r#"{"workers":2,"comm":3}"#, 4).is_err());
        assert!(Exchange::from_metadata(r#"{"workers":2,"threads":"4"}"#, 4).is_err());
        // Workers per process that no grouping of the run's world has: named, not followed.
        for (workers, world) in [(1_000_000, 4), (0, 4), (3, 4)] {
            let text = format!(r#"{{"workers":{workers}}}"#);
            let why = Exchange::from_metadata(&text, world).unwrap_err();
            assert!(
                why.contains(&format!("records {workers} workers per process")),
                "{why}"
            );
        }

        let follow = |given: &TrainOptions, one_process: bool| {
            let groups = recorded.groups_to_take(given, |group, value| {
                Exchange::applies(group, Some(value), one_process)
            });
            let flags: Vec<String> = groups.iter().flat_map(|g| g.flags.clone()).collect();
            (groups, flags)
        };
        // The given compression wins; one bucket cap given takes neither of the run's, the
        // bandwidth given none neither of its link; the port within a process is not one
        // process's.
        let given = TrainOptions {
            compress: Some("none".into()),
            bucket_kb: Some(32.into()),
            link_bandwidth: Some("none".into()),
            ..Default::default()
        };
        let (groups, flags) = follow(&given, true);
        assert_eq!(flags, ["--comm ring"]);
        let aside = ["--first-bucket-kb 8", "--link-latency 5us"];
        assert_eq!(recorded.set_aside(&given), aside);
        assert_eq!(groups[0].group, Group::Comm);
        assert_eq!(groups[0].options.comm.as_deref(), Some("ring"));
        assert_eq!(groups[0].options.compress, None);
        let (groups, flags) = follow(&TrainOptions::default(), false);
        assert_eq!(
            flags,
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
        // One entry per group, the pair of a group together.
        let link = groups.iter().find(|g| g.group == Group::Link).unwrap();
        assert_eq!(link.flags.len(), 2);
        assert_eq!(groups.len(), 5);
        assert!(!Exchange::applies(Group::Comm, Some("mpi-native"), true));
        assert!(!Exchange::applies(Group::Comm, Some("shm"), false));
        // A resume that gives one option of every group that applies takes nothing.
        let one_process = |g| Exchange::applies(g, None, true);
        assert!(!Exchange::every_group_given(&given, one_process));
        let every = TrainOptions {
            overlap: Some("on".into()),
            comm: Some("auto".into()),
            schedule: Some("overlap".into()),
            on_nonfinite: Some("stop".into()),
            ..given
        };
        assert!(Exchange::every_group_given(&every, one_process));
        assert!(!Exchange::every_group_given(&every, |g| Exchange::applies(
            g, None, false
        )));
    }
}

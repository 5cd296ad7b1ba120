//! What a checkpoint records of the parts of its run that a resume follows where the options
//! leave them out (`crate::train::follow`, `crate::train::recipe`): one type for the three,
//! so each is read, judged and said alike.

/// One part of a run's record that a resume follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// The learning rate, its schedule and warm-up, the SGD settings and the augmentation
    /// (`crate::train::recipe::Recipe`).
    Recipe,
    /// How the run evaluated, committed, checkpointed, logged and what it kept
    /// (`crate::train::recipe::Routine`).
    Routine,
    /// How the run's workers combined their gradients (`crate::config::Exchange`).
    Exchange,
}

impl Record {
    /// What the record holds, in words.
    pub fn name(self) -> &'static str {
        match self {
            Self::Recipe => "learning rate, schedule, SGD settings and augmentation",
            Self::Routine => "evaluation, checkpoint and log routine",
            Self::Exchange => "communication options",
        }
    }

    /// The options that, given, leave nothing to take from the record: each of the recipe's
    /// and the routine's; for the exchange, one of each of its groups
    /// ([`crate::config::ExchangeGroup`], named by its first: `--link-latency` alone is
    /// refused) that the resume's transport has, and over MPI `--workers`.
    pub fn options(self) -> String {
        match self {
            Self::Recipe => "--lr, --lr-schedule, --warmup-steps, --momentum, --weight-decay, \
                             --nesterov, --augment"
                .into(),
            Self::Routine => "--test-limit, --commit-every, --checkpoint-every, \
                              --keep-checkpoints, --keep-commits, --log-every"
                .into(),
            Self::Exchange => {
                use crate::config::Exchange;
                let firsts: Vec<String> = Exchange::flags_by_group()
                    .into_iter()
                    .map(|(group, flags)| {
                        let in_one_process = Exchange::applies(group, None, true);
                        let only = if in_one_process { "" } else { " (over MPI)" };
                        format!("{}{only}", flags[0])
                    })
                    .collect();
                format!(
                    "--workers (over MPI), and an option of each group: {}",
                    firsts.join(", ")
                )
            }
        }
    }
}

impl std::fmt::Display for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a checkpoint records of one part of its run ([`Record`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded<T> {
    /// Nothing: written before dptrain recorded it.
    Absent,
    /// Read back, every value one the flags accept.
    Read(T),
    /// An entry that does not read back, or a value the flags refuse: what is wrong. Only a
    /// resume that would take from it refuses it (`ResumeError::UnreadableRecord`); eval,
    /// predict, export and `--weights` do not read it.
    Unreadable(String),
}

impl<T> Recorded<T> {
    /// The record, where it reads back.
    pub fn read(&self) -> Option<&T> {
        match self {
            Self::Read(t) => Some(t),
            _ => None,
        }
    }

    /// A record read from metadata: absent (`Ok(None)`), read, or why it does not read.
    pub fn from_result(read: Result<Option<T>, String>) -> Self {
        match read {
            Ok(None) => Self::Absent,
            Ok(Some(t)) => Self::Read(t),
            Err(why) => Self::Unreadable(why),
        }
    }

    /// Why the record does not read back, where it does not.
    pub fn unreadable(&self) -> Option<&str> {
        match self {
            Self::Unreadable(why) => Some(why),
            _ => None,
        }
    }

    /// Whether the checkpoint holds no record of it (an older dptrain's).
    pub fn is_absent(&self) -> bool {
        matches!(self, Self::Absent)
    }
}

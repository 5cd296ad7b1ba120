//! The value of the KiB options whose default dptrain computes (`--bucket-kb`,
//! `--first-bucket-kb`, `--partition-kb`, `--credit-kb`): a number, or `auto`, the computed
//! default asked for by name. A resume takes its run's value of an option not given
//! (`crate::train::follow`); `auto` is how a resume asks for the default again once the run
//! had a number.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A KiB option's value (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KibOrAuto {
    /// This many KiB.
    Kib(usize),
    /// The default dptrain computes, as if the option were not given.
    Auto,
}

impl KibOrAuto {
    /// The KiB given, `None` for `auto`.
    pub fn kib(self) -> Option<usize> {
        match self {
            Self::Kib(n) => Some(n),
            Self::Auto => None,
        }
    }

    /// The option as given (`None`: not given) as the resolved configuration takes it: a
    /// number, or the default's `None`.
    pub fn resolved(given: Option<Self>) -> Option<usize> {
        given.and_then(Self::kib)
    }
}

impl From<usize> for KibOrAuto {
    fn from(kib: usize) -> Self {
        Self::Kib(kib)
    }
}

impl std::fmt::Display for KibOrAuto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Kib(n) => write!(f, "{n}"),
            Self::Auto => f.write_str("auto"),
        }
    }
}

/// Plain parsing, for clap's default parser type; the command line's values are read by
/// `cli::values`, which says what is wrong with a number as for every other option.
impl std::str::FromStr for KibOrAuto {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(Self::Auto),
            t => t
                .parse()
                .map(Self::Kib)
                .map_err(|_| format!("{s:?}: give a whole number of KiB, or auto")),
        }
    }
}

/// A number, or the string `auto` (a config file's `bucket-kb = 64` or `"auto"`; a
/// checkpoint's record likewise, so that records written before `auto` read back).
impl Serialize for KibOrAuto {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Kib(n) => s.serialize_u64(*n as u64),
            Self::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for KibOrAuto {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = KibOrAuto;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a whole number of KiB, or \"auto\"")
            }

            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<KibOrAuto, E> {
                usize::try_from(n)
                    .map(KibOrAuto::Kib)
                    .map_err(|_| E::custom(format!("{n} KiB is more than this machine addresses")))
            }

            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<KibOrAuto, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!(
                        "{n} is negative: give a whole number of KiB, or \"auto\""
                    ))),
                }
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<KibOrAuto, E> {
                match s {
                    "auto" => Ok(KibOrAuto::Auto),
                    _ => Err(E::custom(format!(
                        "{s:?}: give a whole number of KiB, or \"auto\""
                    ))),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_or_auto_reads_back_from_text_json_and_toml() {
        assert_eq!("64".parse(), Ok(KibOrAuto::Kib(64)));
        assert_eq!(" auto ".parse(), Ok(KibOrAuto::Auto));
        assert!("-1".parse::<KibOrAuto>().is_err());
        for v in [KibOrAuto::Kib(0), KibOrAuto::Kib(4096), KibOrAuto::Auto] {
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(serde_json::from_str::<KibOrAuto>(&json).unwrap(), v);
            assert_eq!(v.to_string().parse(), Ok(v));
        }
        assert_eq!(serde_json::to_string(&KibOrAuto::Kib(64)).unwrap(), "64");
        #[derive(Deserialize)]
        struct File {
            kb: KibOrAuto,
        }
        let read = |text: &str| toml::from_str::<File>(text).map(|f| f.kb);
        assert_eq!(read("kb = 64").unwrap(), KibOrAuto::Kib(64));
        assert_eq!(read("kb = \"auto\"").unwrap(), KibOrAuto::Auto);
        for bad in ["kb = -1", "kb = \"fast\"", "kb = 1.5"] {
            assert!(read(bad).is_err(), "{bad}");
        }
        assert_eq!(KibOrAuto::resolved(Some(KibOrAuto::Auto)), None);
        assert_eq!(KibOrAuto::resolved(Some(8.into())), Some(8));
    }
}

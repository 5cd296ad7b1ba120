//! The one place numbers on the command line are read. Every option of every subcommand whose
//! value is a number (a `usize`, `u64`, `u32`, `u8`, `f32` or `f64` field) gets its value
//! parser here, walked over the whole command tree, so that no option is missed and every one
//! says the same things the same way: a negative number reaches the parser (instead of being
//! taken for a flag, "unexpected argument '-1'"), and is refused as negative; `1e30` for a
//! count is "not a whole number"; a count past the type's range names the largest allowed; NaN
//! and infinities are refused for every float. clap prints each refusal as
//! `invalid value 'V' for '--option <OPTION>': REASON` and exits with 2.
//!
//! What a value means past its type (0 epochs, an efficiency above 1) is each option's own
//! check, made before anything is loaded ([`crate::config::TrainOptions::resolve`] and each
//! command's argument checks), so that a config file's values get the same checks.

use clap::builder::ValueParser;
use clap::{Arg, Command};
use std::any::TypeId;

/// `cmd` and all its subcommands with the number parsers of this module in place of clap's.
pub(super) fn with_number_parsers(cmd: Command) -> Command {
    cmd.mut_args(number_arg)
        .mut_subcommands(with_number_parsers)
}

/// One argument, with a number parser if its value is a number.
fn number_arg(arg: Arg) -> Arg {
    if !arg.get_action().takes_values() {
        return arg;
    }
    // Any value may look like a negative number (`--image-size -1`): let the option's own
    // parser say what is wrong with it rather than clap calling it an unknown flag.
    let arg = arg.allow_negative_numbers(true);
    let id = arg.get_value_parser().type_id();
    let parser = if id == TypeId::of::<usize>() {
        ValueParser::new(whole::<usize>)
    } else if id == TypeId::of::<u64>() {
        ValueParser::new(whole::<u64>)
    } else if id == TypeId::of::<u32>() {
        ValueParser::new(whole::<u32>)
    } else if id == TypeId::of::<u8>() {
        ValueParser::new(whole::<u8>)
    } else if id == TypeId::of::<f64>() {
        ValueParser::new(real::<f64>)
    } else if id == TypeId::of::<f32>() {
        ValueParser::new(real::<f32>)
    } else if id == TypeId::of::<crate::config::KibOrAuto>() {
        ValueParser::new(kib_or_auto)
    } else {
        return arg;
    };
    arg.value_parser(parser)
}

/// A whole number of type `T`: digits only (no sign, point or exponent), within `T`'s range.
pub fn whole<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr + std::fmt::Display + Bounded,
{
    let t = s.trim();
    if t.starts_with('-') && t.len() > 1 {
        // No minimum here: each option says its own (most refuse 0 too).
        return Err(format!(
            "a negative number; give a whole number (at most {})",
            T::MAX
        ));
    }
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "not a whole number; give digits only (no sign, point or exponent), at most {}",
            T::MAX
        ));
    }
    t.parse::<T>()
        .map_err(|_| format!("too large: the largest allowed is {}", T::MAX))
}

/// A KiB option that also takes `auto` (`crate::config::KibOrAuto`): `auto`, or a whole
/// number read as [`whole`] reads one.
pub fn kib_or_auto(s: &str) -> Result<crate::config::KibOrAuto, String> {
    match s.trim() {
        "auto" => Ok(crate::config::KibOrAuto::Auto),
        _ => whole::<usize>(s)
            .map(crate::config::KibOrAuto::Kib)
            .map_err(|e| format!("{e}; or auto, for the default")),
    }
}

/// A finite number of 0 or more (no option takes a negative one, a NaN or an infinity).
pub fn real<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr + Into<f64> + Copy,
{
    let x: T = s
        .trim()
        .parse()
        .map_err(|_| "not a number; give a decimal number such as 0.5 or 1e-3".to_string())?;
    let v: f64 = x.into();
    if v.is_nan() {
        return Err("not a number (NaN); give a finite number".into());
    }
    if v.is_infinite() {
        return Err("infinite (or too large for a float); give a finite number".into());
    }
    if v < 0.0 {
        // Not "0 or more": several options refuse 0 too, each in its own check.
        return Err("a negative number, which no option takes".into());
    }
    Ok(x)
}

/// The largest value of an unsigned type, for the messages.
pub trait Bounded {
    /// The largest value.
    const MAX: Self;
}

macro_rules! bounded {
    ($($t:ty),*) => { $( impl Bounded for $t { const MAX: Self = <$t>::MAX; } )* };
}
bounded!(usize, u64, u32, u8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_say_what_is_wrong() {
        assert_eq!(whole::<usize>("42"), Ok(42));
        assert!(whole::<usize>("-1").unwrap_err().contains("negative"));
        assert!(whole::<usize>("1e30")
            .unwrap_err()
            .contains("not a whole number"));
        assert!(whole::<usize>("")
            .unwrap_err()
            .contains("not a whole number"));
        assert!(whole::<u64>("18446744073709551616")
            .unwrap_err()
            .contains("the largest allowed is 18446744073709551615"));
        assert!(whole::<u8>("256").unwrap_err().contains("255"));
    }

    #[test]
    fn a_kib_option_takes_a_whole_number_or_auto() {
        use crate::config::KibOrAuto;
        assert_eq!(kib_or_auto("64"), Ok(KibOrAuto::Kib(64)));
        assert_eq!(kib_or_auto("auto"), Ok(KibOrAuto::Auto));
        let err = kib_or_auto("-1").unwrap_err();
        assert!(
            err.contains("negative") && err.ends_with("or auto, for the default"),
            "{err}"
        );
    }

    #[test]
    fn reals_are_finite_and_not_negative() {
        assert_eq!(real::<f64>("0.5"), Ok(0.5));
        assert_eq!(real::<f32>("1e-3"), Ok(1e-3));
        assert!(real::<f64>("NaN").unwrap_err().contains("NaN"));
        assert!(real::<f64>("inf").unwrap_err().contains("infinite"));
        assert!(real::<f32>("1e39").unwrap_err().contains("infinite"));
        assert!(real::<f64>("-1").unwrap_err().contains("negative"));
        assert!(real::<f64>("x").unwrap_err().contains("not a number"));
    }
}

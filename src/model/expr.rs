//! Integer expressions in model files: `"$out * 4"`, `"$channels / 2"`, `"classes"`.
//!
//! Template parameters (`$name`) are substituted when a template is instantiated; `channels`
//! (the layer's input channels) and `classes` (the dataset's class count) are known only when
//! shapes are inferred, so an expression may stay partly unevaluated until then.

use super::bounds::{MAX_EXPR_DEPTH, MAX_EXPR_TERMS};
use std::collections::BTreeMap;
use std::fmt;

/// Why an expression cannot be parsed or evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExprError {
    /// Not an expression (the message says where).
    #[error("{0}")]
    Syntax(String),
    /// Parentheses nest deeper than [`MAX_EXPR_DEPTH`].
    #[error("parentheses nest deeper than {MAX_EXPR_DEPTH} levels in expression \"{0}\"")]
    TooDeep(String),
    /// More than [`MAX_EXPR_TERMS`] numbers and variables.
    #[error("expression has more than {MAX_EXPR_TERMS} numbers and variables")]
    TooLong,
    /// A variable nothing binds.
    #[error("unknown variable ${0}")]
    UnknownVar(String),
    /// `x / 0`.
    #[error("division by zero in {0}")]
    DivisionByZero(String),
    /// A result past the 64-bit integers.
    #[error("{a} {op} {b} overflows 64-bit integers")]
    Overflow {
        /// Left operand.
        a: i64,
        /// The operation.
        op: char,
        /// Right operand.
        b: i64,
    },
}

/// A parsed integer expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// A literal.
    Num(i64),
    /// A variable: a template parameter, `channels` or `classes`.
    Var(String),
    /// A binary operation (`+ - * /`; `/` is floor division).
    Bin(Box<Expr>, char, Box<Expr>),
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Num(v) => write!(f, "{v}"),
            Expr::Var(v) => write!(f, "${v}"),
            Expr::Bin(a, op, b) => write!(f, "({a} {op} {b})"),
        }
    }
}

/// Variables known when shapes are inferred.
pub const SHAPE_VARS: [&str; 2] = ["channels", "classes"];

impl Expr {
    /// Parses `s`: integers, `$name` (or bare `classes` / `channels`), `+ - * /`, parentheses.
    /// At most [`MAX_EXPR_TERMS`] terms and [`MAX_EXPR_DEPTH`] levels of parentheses, so
    /// that parsing, evaluating and dropping (all recursive) stay shallow.
    pub fn parse(s: &str) -> Result<Expr, ExprError> {
        let toks = tokenize(s)?;
        let terms = toks
            .iter()
            .filter(|t| t.starts_with('$') || t.starts_with(|c: char| c.is_ascii_digit()))
            .count();
        if terms > MAX_EXPR_TERMS {
            return Err(ExprError::TooLong);
        }
        let mut p = Parser {
            toks: &toks,
            pos: 0,
            depth: 0,
            text: s,
        };
        let e = p.sum()?;
        if p.pos != toks.len() {
            return Err(ExprError::Syntax(format!(
                "unexpected '{}' in expression \"{s}\"",
                toks[p.pos]
            )));
        }
        Ok(e)
    }

    /// Substitutes the variables bound in `vars`; others are left in place.
    pub fn bind(&self, vars: &BTreeMap<String, i64>) -> Expr {
        match self {
            Expr::Var(v) => vars.get(v).map_or_else(|| self.clone(), |&n| Expr::Num(n)),
            Expr::Bin(a, op, b) => Expr::Bin(Box::new(a.bind(vars)), *op, Box::new(b.bind(vars))),
            Expr::Num(_) => self.clone(),
        }
    }

    /// The variables still unbound.
    pub fn free_vars(&self, out: &mut Vec<String>) {
        match self {
            Expr::Var(v) => out.push(v.clone()),
            Expr::Bin(a, _, b) => {
                a.free_vars(out);
                b.free_vars(out);
            }
            Expr::Num(_) => {}
        }
    }

    /// Evaluates with `vars`; every variable must be bound.
    pub fn eval(&self, vars: &BTreeMap<String, i64>) -> Result<i64, ExprError> {
        match self {
            Expr::Num(v) => Ok(*v),
            Expr::Var(v) => vars
                .get(v)
                .copied()
                .ok_or_else(|| ExprError::UnknownVar(v.clone())),
            Expr::Bin(x, op, y) => {
                let (a, b) = (x.eval(vars)?, y.eval(vars)?);
                let r = match op {
                    '+' => a.checked_add(b),
                    '-' => a.checked_sub(b),
                    '*' => a.checked_mul(b),
                    _ if b == 0 => return Err(ExprError::DivisionByZero(self.to_string())),
                    // i64::MIN / -1 overflows.
                    _ => a.checked_div_euclid(b),
                };
                r.ok_or(ExprError::Overflow { a, op: *op, b })
            }
        }
    }
}

fn tokenize(s: &str) -> Result<Vec<String>, ExprError> {
    let mut toks = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c.is_ascii_digit() {
            let mut t = String::new();
            while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                t.push(d);
                chars.next();
            }
            toks.push(t);
        } else if c == '$' || c.is_ascii_alphabetic() || c == '_' {
            let mut t = String::from("$");
            if c == '$' {
                chars.next();
            }
            while let Some(&d) = chars
                .peek()
                .filter(|d| d.is_ascii_alphanumeric() || **d == '_')
            {
                t.push(d);
                chars.next();
            }
            if t.len() == 1 {
                return Err(ExprError::Syntax(format!(
                    "'$' without a name in expression \"{s}\""
                )));
            }
            toks.push(t);
        } else if "+-*/()".contains(c) {
            toks.push(c.to_string());
            chars.next();
        } else {
            return Err(ExprError::Syntax(format!(
                "unexpected character '{}' in expression \"{}\"",
                c.escape_debug(),
                s.escape_debug()
            )));
        }
    }
    if toks.is_empty() {
        return Err(ExprError::Syntax("empty expression".into()));
    }
    Ok(toks)
}

struct Parser<'a> {
    toks: &'a [String],
    pos: usize,
    /// Parentheses open at `pos`.
    depth: usize,
    /// The expression, for messages.
    text: &'a str,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.toks.get(self.pos).map(String::as_str)
    }
    fn sum(&mut self) -> Result<Expr, ExprError> {
        let mut e = self.product()?;
        while let Some(op @ ("+" | "-")) = self.peek() {
            let op = op.chars().next().expect("one char");
            self.pos += 1;
            e = Expr::Bin(Box::new(e), op, Box::new(self.product()?));
        }
        Ok(e)
    }
    fn product(&mut self) -> Result<Expr, ExprError> {
        let mut e = self.atom()?;
        while let Some(op @ ("*" | "/")) = self.peek() {
            let op = op.chars().next().expect("one char");
            self.pos += 1;
            e = Expr::Bin(Box::new(e), op, Box::new(self.atom()?));
        }
        Ok(e)
    }
    fn atom(&mut self) -> Result<Expr, ExprError> {
        let t = self
            .peek()
            .ok_or_else(|| ExprError::Syntax("expression ends too early".into()))?
            .to_string();
        self.pos += 1;
        if t == "(" {
            if self.depth >= MAX_EXPR_DEPTH {
                return Err(ExprError::TooDeep(self.text.chars().take(80).collect()));
            }
            self.depth += 1;
            let e = self.sum()?;
            self.depth -= 1;
            if self.peek() != Some(")") {
                return Err(ExprError::Syntax("missing ')'".into()));
            }
            self.pos += 1;
            Ok(e)
        } else if let Some(name) = t.strip_prefix('$') {
            Ok(Expr::Var(name.to_string()))
        } else if t.chars().all(|c| c.is_ascii_digit()) {
            t.parse().map(Expr::Num).map_err(|_| {
                ExprError::Syntax(format!("number too large for 64-bit integers: {t}"))
            })
        } else {
            Err(ExprError::Syntax(format!("unexpected '{t}'")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_evaluates() {
        let vars: BTreeMap<String, i64> = [("out".into(), 16), ("channels".into(), 24)].into();
        let e = |s: &str| Expr::parse(s).unwrap().eval(&vars).unwrap();
        assert_eq!(e("$out * 4"), 64);
        assert_eq!(e("$channels / 2 + 1"), 13);
        assert_eq!(e("(1 + 2) * $out"), 48);
        assert_eq!(e("channels * 6"), 144);
        assert!(Expr::parse("3 +").is_err());
        assert!(Expr::parse("3 % 2").is_err());
        assert!(Expr::parse("$a").unwrap().eval(&vars).is_err());
        let partly = Expr::parse("$expand * $channels").unwrap();
        let bound = partly.bind(&[("expand".to_string(), 6)].into());
        let mut free = Vec::new();
        bound.free_vars(&mut free);
        assert_eq!(free, vec!["channels".to_string()]);
        assert_eq!(bound.eval(&vars).unwrap(), 144);
    }

    #[test]
    fn nesting_length_and_overflow_are_refused_by_name() {
        let deep = format!("{}1{}", "(".repeat(20_000), ")".repeat(20_000));
        assert!(matches!(Expr::parse(&deep), Err(ExprError::TooDeep(_))));
        let ok = format!("{}1{}", "(".repeat(64), ")".repeat(64));
        assert_eq!(Expr::parse(&ok).unwrap(), Expr::Num(1));
        let long = "1+".repeat(100_000) + "1";
        assert_eq!(Expr::parse(&long), Err(ExprError::TooLong));
        let vars = BTreeMap::new();
        let e = Expr::parse("4000000000000000000 * 4").unwrap().eval(&vars);
        assert!(
            matches!(e, Err(ExprError::Overflow { op: '*', .. })),
            "{e:?}"
        );
        let e = Expr::parse("0 - 9223372036854775807 - 1").unwrap();
        let min = e.eval(&vars).unwrap();
        let div = Expr::Bin(Box::new(Expr::Num(min)), '/', Box::new(Expr::Num(-1)));
        assert!(matches!(div.eval(&vars), Err(ExprError::Overflow { .. })));
    }
}

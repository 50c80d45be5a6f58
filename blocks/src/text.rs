//! The text syntax for subscription filters.
//!
//! ```text
//! filter  := and ( ("||" | "or") and )*
//! and     := atom ( ("&&" | "and") atom )*
//! atom    := "(" filter ")" | pred
//! pred    := attr "exists" | attr "not" "exists"
//!          | attr ("<" | "<=" | ">" | ">=") number
//!          | attr ("=" | "==" | "!=") (number | string)
//!          | attr ["not"] "in" "[" lit ("," lit)* "]"          (all numbers or all strings)
//!          | attr ["not"] ("prefix" | "suffix" | "contains" | "ieq") string
//!          | attr ["not"] ("iprefix" | "isuffix" | "wildcard" | "cidr") string
//!          | attr ["not"] "range" ("[" | "(") (number | "*") "," (number | "*") ("]" | ")")
//! attr    := identifier (letters, digits, _ . - / :) | string
//! string  := JSON string literal; number := decimal, optional exponent (exact, see `num`)
//! ```
//! Example: `temp > 30 && site prefix "kr/seoul/" || type in ["cam","lidar"]`.
//! Errors carry the column (1-based, in characters) and say what was expected; they quote at
//! most [`crate::quote::QUOTE_CHARS`] characters of the input. Parentheses nest at most
//! [`MAX_NESTING`] deep, so the recursive descent (and everything that walks the formula after
//! it) has a bounded stack.

use crate::formula::{Dnf, Formula, MAX_NESTING};
use crate::num::Num;
use crate::predicate::{Bound, Predicate, Test};
use crate::quote::{clip, quoted};

/// A syntax error with its position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at column {column}: expected {expected}, found {found}")]
pub struct ParseError {
    /// 1-based column, counted in characters.
    pub column: usize,
    pub expected: String,
    pub found: String,
}

/// Words that cannot be bare attribute names (quote them instead).
pub fn is_keyword(s: &str) -> bool {
    matches!(
        s,
        "and" | "or" | "not" | "in" | "exists" | "prefix" | "suffix" | "contains" | "ieq" | "range"
    )
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Num(String),
    Sym(&'static str),
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{}`", clip(s)),
            Tok::Str(s) => format!("string {}", quoted(s)),
            Tok::Num(s) => format!("number {}", clip(s)),
            Tok::Sym(s) => format!("`{s}`"),
            Tok::End => "end of input".to_string(),
        }
    }
}

struct Lexer {
    toks: Vec<(Tok, usize)>,
}

fn lex(input: &str) -> Result<Lexer, ParseError> {
    let chars: Vec<(usize, char)> = input.char_indices().collect();
    let col = |ci: usize| ci + 1;
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i].1;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        let two: String = chars[i..chars.len().min(i + 2)]
            .iter()
            .map(|x| x.1)
            .collect();
        let sym: Option<&'static str> = match two.as_str() {
            "&&" => Some("&&"),
            "||" => Some("||"),
            "<=" => Some("<="),
            ">=" => Some(">="),
            "==" => Some("="),
            "!=" => Some("!="),
            _ => None,
        };
        if let Some(s) = sym {
            toks.push((Tok::Sym(s), col(start)));
            i += 2;
            continue;
        }
        let one: Option<&'static str> = match c {
            '<' => Some("<"),
            '>' => Some(">"),
            '=' => Some("="),
            '(' => Some("("),
            ')' => Some(")"),
            '[' => Some("["),
            ']' => Some("]"),
            ',' => Some(","),
            '*' => Some("*"),
            _ => None,
        };
        if let Some(s) = one {
            toks.push((Tok::Sym(s), col(start)));
            i += 1;
            continue;
        }
        if c == '"' {
            // find the closing quote, honouring backslash escapes, then decode as JSON
            let mut j = i + 1;
            let mut escaped = false;
            while j < chars.len() {
                let d = chars[j].1;
                if escaped {
                    escaped = false;
                } else if d == '\\' {
                    escaped = true;
                } else if d == '"' {
                    break;
                }
                j += 1;
            }
            if j >= chars.len() {
                return Err(ParseError {
                    column: col(start),
                    expected: "a closing `\"`".into(),
                    found: "end of input".into(),
                });
            }
            let byte_start = chars[i].0;
            let byte_end = chars[j].0 + 1;
            let raw = &input[byte_start..byte_end];
            let s: String = serde_json::from_str(raw).map_err(|e| ParseError {
                column: col(start),
                expected: "a valid string literal".into(),
                found: format!("{} ({e})", clip(raw)),
            })?;
            toks.push((Tok::Str(s), col(start)));
            i = j + 1;
            continue;
        }
        if c.is_ascii_digit()
            || ((c == '-' || c == '+' || c == '.')
                && chars
                    .get(i + 1)
                    .is_some_and(|x| x.1.is_ascii_digit() || x.1 == '.'))
        {
            let mut j = i + 1;
            while j < chars.len() {
                let d = chars[j].1;
                let prev = chars[j - 1].1;
                if d.is_ascii_alphanumeric()
                    || d == '.'
                    || ((d == '-' || d == '+') && (prev == 'e' || prev == 'E'))
                {
                    j += 1;
                } else {
                    break;
                }
            }
            let text: String = chars[i..j].iter().map(|x| x.1).collect();
            toks.push((Tok::Num(text), col(start)));
            i = j;
            continue;
        }
        if c.is_alphabetic() || c == '_' {
            let mut j = i + 1;
            while j < chars.len() {
                let d = chars[j].1;
                if d.is_alphanumeric() || matches!(d, '_' | '.' | '-' | '/' | ':') {
                    j += 1;
                } else {
                    break;
                }
            }
            let text: String = chars[i..j].iter().map(|x| x.1).collect();
            toks.push((Tok::Ident(text), col(start)));
            i = j;
            continue;
        }
        return Err(ParseError {
            column: col(start),
            expected: "an attribute, operator, value or parenthesis".into(),
            found: format!("`{c}`"),
        });
    }
    toks.push((Tok::End, col(chars.len())));
    Ok(Lexer { toks })
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    /// Parentheses open at the current position (bounded by [`MAX_NESTING`]).
    depth: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }

    fn column(&self) -> usize {
        self.toks[self.pos].1
    }

    fn bump(&mut self) -> Tok {
        let t = self.toks[self.pos].0.clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn err<T>(&self, expected: &str) -> Result<T, ParseError> {
        Err(ParseError {
            column: self.column(),
            expected: expected.to_string(),
            found: self.peek().describe(),
        })
    }

    fn is_word(&self, w: &str) -> bool {
        matches!(self.peek(), Tok::Ident(s) if s == w)
    }

    fn expect_sym(&mut self, s: &str) -> Result<(), ParseError> {
        if *self.peek() == Tok::Sym(leak(s)) {
            self.bump();
            Ok(())
        } else {
            self.err(&format!("`{s}`"))
        }
    }

    fn filter(&mut self) -> Result<Formula, ParseError> {
        let mut items = vec![self.and()?];
        while *self.peek() == Tok::Sym("||") || self.is_word("or") {
            self.bump();
            items.push(self.and()?);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            Formula::Or(items)
        })
    }

    fn and(&mut self) -> Result<Formula, ParseError> {
        let mut items = vec![self.atom()?];
        while *self.peek() == Tok::Sym("&&") || self.is_word("and") {
            self.bump();
            items.push(self.atom()?);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            Formula::And(items)
        })
    }

    fn atom(&mut self) -> Result<Formula, ParseError> {
        if *self.peek() == Tok::Sym("(") {
            if self.depth >= MAX_NESTING {
                return self.err(&format!(
                    "at most {MAX_NESTING} levels of nested parentheses (the nesting limit)"
                ));
            }
            self.depth += 1;
            self.bump();
            let f = self.filter()?;
            self.expect_sym(")")?;
            self.depth -= 1;
            return Ok(f);
        }
        let attr = match self.peek().clone() {
            Tok::Ident(s) if !is_keyword(&s) => s,
            Tok::Str(s) => s,
            _ => return self.err("an attribute name or `(`"),
        };
        if attr.is_empty() {
            return self.err("a non-empty attribute name");
        }
        self.bump();
        self.pred(attr).map(Formula::Pred)
    }

    fn number(&mut self) -> Result<Num, ParseError> {
        match self.peek().clone() {
            Tok::Num(s) => {
                let col = self.column();
                let n = Num::parse(&s).map_err(|e| ParseError {
                    column: col,
                    expected: "an exact number".into(),
                    found: e.to_string(),
                })?;
                self.bump();
                Ok(n)
            }
            _ => self.err("a number"),
        }
    }

    fn string(&mut self) -> Result<String, ParseError> {
        match self.peek().clone() {
            Tok::Str(s) => {
                self.bump();
                Ok(s)
            }
            _ => self.err("a string literal in double quotes"),
        }
    }

    fn pred(&mut self, attr: String) -> Result<Predicate, ParseError> {
        let mut negated = false;
        if self.is_word("not") {
            self.bump();
            negated = true;
        }
        let tok = self.peek().clone();
        let test = match tok {
            Tok::Ident(w) if w == "exists" => {
                self.bump();
                Test::Exists
            }
            Tok::Ident(w) if w == "in" => {
                self.bump();
                self.list()?
            }
            Tok::Ident(w)
                if matches!(
                    w.as_str(),
                    "prefix"
                        | "suffix"
                        | "contains"
                        | "ieq"
                        | "iprefix"
                        | "isuffix"
                        | "wildcard"
                        | "cidr"
                ) =>
            {
                self.bump();
                let col = self.column();
                let s = self.string()?;
                let refused = |e: crate::pattern::PatternConstError| ParseError {
                    column: col,
                    expected: format!("a {w} constant"),
                    found: e.to_string(),
                };
                match w.as_str() {
                    "prefix" => Test::Prefix(s),
                    "suffix" => Test::Suffix(s),
                    "contains" => Test::Contains(s),
                    "iprefix" => Test::PrefixIgnoreCase(s),
                    "isuffix" => Test::SuffixIgnoreCase(s),
                    "wildcard" => {
                        crate::pattern::check_wildcard(&s).map_err(refused)?;
                        Test::Wildcard(s)
                    }
                    "cidr" => Test::Cidr(crate::pattern::canonical_cidr(&s).map_err(refused)?),
                    _ => Test::EqIgnoreCase(s),
                }
            }
            Tok::Ident(w) if w == "range" => {
                self.bump();
                self.range()?
            }
            Tok::Sym(s) if !negated && matches!(s, "<" | "<=" | ">" | ">=") => {
                self.bump();
                let n = self.number()?;
                let (lo, hi) = match s {
                    "<" => (Bound::Unbounded, Bound::Excl(n)),
                    "<=" => (Bound::Unbounded, Bound::Incl(n)),
                    ">" => (Bound::Excl(n), Bound::Unbounded),
                    _ => (Bound::Incl(n), Bound::Unbounded),
                };
                Test::Interval { lo, hi }
            }
            Tok::Sym(s) if !negated && matches!(s, "=" | "!=") => {
                self.bump();
                negated = s == "!=";
                match self.peek().clone() {
                    Tok::Num(_) => {
                        let n = self.number()?;
                        Test::Interval {
                            lo: Bound::Incl(n),
                            hi: Bound::Incl(n),
                        }
                    }
                    Tok::Str(v) => {
                        self.bump();
                        Test::StrIn(vec![v])
                    }
                    _ => return self.err("a number or a string literal"),
                }
            }
            _ => {
                return self.err(if negated {
                    "`exists`, `in`, `prefix`, `suffix`, `contains`, `ieq` or `range` after `not`"
                } else {
                    "an operator (< <= > >= = != in prefix suffix contains ieq range exists not)"
                });
            }
        };
        Ok(Predicate::new(attr, test, negated))
    }

    fn list(&mut self) -> Result<Test, ParseError> {
        self.expect_sym("[")?;
        let mut nums = Vec::new();
        let mut strs = Vec::new();
        loop {
            match self.peek().clone() {
                Tok::Num(_) if strs.is_empty() => nums.push(self.number()?),
                Tok::Str(s) if nums.is_empty() => {
                    self.bump();
                    strs.push(s);
                }
                _ if nums.is_empty() && strs.is_empty() => {
                    return self.err("a number or string literal (sets cannot be empty)");
                }
                _ if nums.is_empty() => return self.err("a string literal (sets hold one type)"),
                _ => return self.err("a number (sets hold one type)"),
            }
            if *self.peek() == Tok::Sym(",") {
                self.bump();
                continue;
            }
            self.expect_sym("]")?;
            break;
        }
        Ok(if nums.is_empty() {
            Test::StrIn(strs)
        } else {
            Test::NumIn(nums)
        })
    }

    fn range(&mut self) -> Result<Test, ParseError> {
        let lo_incl = match self.peek() {
            Tok::Sym("[") => true,
            Tok::Sym("(") => false,
            _ => return self.err("`[` or `(` opening a range"),
        };
        self.bump();
        let lo = if *self.peek() == Tok::Sym("*") {
            self.bump();
            Bound::Unbounded
        } else {
            let n = self.number()?;
            if lo_incl {
                Bound::Incl(n)
            } else {
                Bound::Excl(n)
            }
        };
        self.expect_sym(",")?;
        let hi_col = self.column();
        let hi_num = if *self.peek() == Tok::Sym("*") {
            self.bump();
            None
        } else {
            Some(self.number()?)
        };
        let hi_incl = match self.peek() {
            Tok::Sym("]") => true,
            Tok::Sym(")") => false,
            _ => return self.err("`]` or `)` closing a range"),
        };
        self.bump();
        let hi = match hi_num {
            None => Bound::Unbounded,
            Some(n) if hi_incl => Bound::Incl(n),
            Some(n) => Bound::Excl(n),
        };
        if let (Bound::Incl(a) | Bound::Excl(a), Bound::Incl(b) | Bound::Excl(b)) = (lo, hi)
            && a > b
        {
            return Err(ParseError {
                column: hi_col,
                expected: "an upper bound not below the lower bound".into(),
                found: format!("{b} < {a}"),
            });
        }
        Ok(Test::Interval { lo, hi })
    }
}

fn leak(s: &str) -> &'static str {
    // symbols are a closed set; map back to the static spelling
    match s {
        "(" => "(",
        ")" => ")",
        "[" => "[",
        "]" => "]",
        "," => ",",
        _ => "?",
    }
}

/// Parses a filter in the text syntax into a formula.
pub fn parse_formula(input: &str) -> Result<Formula, ParseError> {
    let Lexer { toks } = lex(input)?;
    let mut p = Parser {
        toks,
        pos: 0,
        depth: 0,
    };
    if *p.peek() == Tok::End {
        return p.err("a filter such as `temp > 30`");
    }
    let f = p.filter()?;
    if *p.peek() != Tok::End {
        return p.err("`&&`, `||` or the end of the filter");
    }
    Ok(f)
}

/// Error from parsing a text filter all the way to conjunctions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextFilterError {
    #[error("{0}")]
    Syntax(#[from] ParseError),
    #[error("{0}")]
    Dnf(#[from] crate::formula::DnfError),
}

/// Parses a text filter into conjunctions.
pub fn parse_text(input: &str) -> Result<Dnf, TextFilterError> {
    Ok(parse_formula(input)?.to_dnf()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(input: &str, canonical: &str) {
        let dnf = parse_text(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(dnf.to_text(), canonical, "{input}");
        // the canonical form reads back to itself
        let again = parse_text(canonical).unwrap_or_else(|e| panic!("{canonical}: {e}"));
        assert_eq!(again, dnf);
    }

    fn bad(input: &str, column: usize, expected_part: &str) {
        match parse_text(input) {
            Err(TextFilterError::Syntax(e)) => {
                assert_eq!(e.column, column, "{input}: {e}");
                assert!(e.expected.contains(expected_part), "{input}: {e}");
            }
            other => panic!("{input}: expected a syntax error, got {other:?}"),
        }
    }

    #[test]
    fn accepts() {
        ok(
            r#"temp > 30 && site prefix "kr/seoul/" || type in ["cam","lidar"]"#,
            r#"site prefix "kr/seoul/" && temp > 30 || type in ["cam", "lidar"]"#,
        );
        ok("x >= -1.5", "x >= -1.5");
        ok("x == 3", "x = 3");
        ok("x != 3", "x != 3");
        ok(r#"x != "a""#, r#"x != "a""#);
        ok("x in [3, 1, 3]", "x in [1, 3]");
        ok("x in [3]", "x = 3");
        ok("x range [1, 5)", "x range [1, 5)");
        ok("x range (*, 5]", "x <= 5");
        ok("x not range [1, 5]", "x not range [1, 5]");
        ok("a exists and b not exists", "a exists && b not exists");
        ok(r#""odd name" = "v""#, r#""odd name" = "v""#);
        ok(r#"s ieq "HeLLo""#, r#"s ieq "hello""#);
        ok(
            r#"s not prefix "x" or s contains "€""#,
            r#"s not prefix "x" || s contains "€""#,
        );
        ok(
            "(a = 1 || b = 2) && c = 3",
            "a = 1 && c = 3 || b = 2 && c = 3",
        );
        ok("a = 1 || a = 1", "a = 1");
    }

    #[test]
    fn rejects_with_positions() {
        bad("", 1, "a filter");
        bad("temp >", 7, "a number");
        bad("temp > 30 &&", 13, "attribute");
        bad("temp ~ 3", 6, "operator");
        bad("temp > 30 site", 11, "`&&`");
        bad(r#"x in [1, "a"]"#, 10, "a number");
        bad("x in []", 7, "sets cannot be empty");
        bad("x range [5, 1]", 13, "upper bound");
        bad("(a = 1", 7, "`)`");
        bad(r#"s prefix 3"#, 10, "string literal");
        bad(r#"x = "abc"#, 5, "closing");
        bad("x > NaN", 5, "a number");
        bad("x > 1e400", 5, "exact number");
        bad("x > 0.0000000000000000001", 5, "exact number");
        bad("in = 3", 1, "attribute");
    }
}

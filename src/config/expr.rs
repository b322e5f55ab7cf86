//! EasyRec's ExprFeature: a number computed per row from input columns by
//! an `expression` such as `(age_level>=item_age_level) & (age_level<=(item_age_level+5))`.
//!
//! EasyRec (`utils/expr_util.py`) turns the text into TensorFlow calls: an
//! operand is arithmetic over input names and numbers (`+ - * /`, Python's
//! precedence, no parentheses inside it), evaluated in float64; operands are
//! joined by `> >= < <= == & |` strictly from left to right (no precedence
//! among those), parentheses grouping. That is what is parsed here; text
//! EasyRec would turn into broken code (`(a+b)*2`, `a=b`, an unknown name)
//! is refused with the position. A comparison is 1 or 0; `&` / `|` are
//! true where both / either side is not 0.

use std::fmt;

/// An ExprFeature's expression as written and as parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Expression {
    pub text: String,
    pub root: Expr,
}

impl Expression {
    pub fn parse(text: &str, names: &[String]) -> Result<Self, ExprError> {
        Ok(Expression {
            text: text.to_string(),
            root: Expr::parse(text, names)?,
        })
    }

    /// The value for one row's inputs.
    pub fn eval(&self, inputs: &[f64]) -> f64 {
        self.root.eval(inputs)
    }
}

/// A parsed expression over the feature's inputs (by index).
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Input(usize),
    Number(f64),
    Neg(Box<Expr>),
    Binary(Op, Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    And,
    Or,
}

impl Op {
    fn apply(self, a: f64, b: f64) -> f64 {
        let truth = |t: bool| if t { 1.0 } else { 0.0 };
        match self {
            Op::Add => a + b,
            Op::Sub => a - b,
            Op::Mul => a * b,
            Op::Div => a / b,
            Op::Gt => truth(a > b),
            Op::Ge => truth(a >= b),
            Op::Lt => truth(a < b),
            Op::Le => truth(a <= b),
            Op::Eq => truth(a == b),
            Op::And => truth(a != 0.0 && b != 0.0),
            Op::Or => truth(a != 0.0 || b != 0.0),
        }
    }
}

impl Expr {
    /// Parses `text` over the inputs `names` (EasyRec's `input_names`).
    pub fn parse(text: &str, names: &[String]) -> Result<Expr, ExprError> {
        let tokens = tokenize(text)?;
        let mut p = Parser {
            tokens: &tokens,
            at: 0,
            names,
            text,
        };
        let e = p.sequence()?;
        match p.peek() {
            None => Ok(e),
            Some(t) => Err(p.error(t.1, format!("unexpected `{}`", t.0))),
        }
    }

    /// The value for one row's inputs.
    pub fn eval(&self, inputs: &[f64]) -> f64 {
        match self {
            Expr::Input(i) => inputs[*i],
            Expr::Number(x) => *x,
            Expr::Neg(e) => -e.eval(inputs),
            Expr::Binary(op, a, b) => op.apply(a.eval(inputs), b.eval(inputs)),
        }
    }
}

/// Why an expression cannot be used, with the character position.
#[derive(Debug, Clone, PartialEq)]
pub struct ExprError {
    pub at: usize,
    pub message: String,
}

impl fmt::Display for ExprError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at character {}: {}", self.at + 1, self.message)
    }
}

/// Tokens with their character offsets: operators, parentheses and words
/// (names and numbers, anything else up to the next operator or space).
fn tokenize(text: &str) -> Result<Vec<(String, usize)>, ExprError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
        if [">=", "<=", "=="].contains(&two.as_str()) {
            out.push((two, i));
            i += 2;
        } else if "+-*/()<>&|".contains(c) {
            out.push((c.to_string(), i));
            i += 1;
        } else if c == '=' {
            return Err(ExprError {
                at: i,
                message: "`=` alone is not an operator (`==` compares)".into(),
            });
        } else {
            let start = i;
            while i < chars.len() && !chars[i].is_whitespace() && !"+-*/()<>&|=".contains(chars[i]) {
                i += 1;
            }
            out.push((chars[start..i].iter().collect(), start));
        }
    }
    Ok(out)
}

struct Parser<'a> {
    tokens: &'a [(String, usize)],
    at: usize,
    names: &'a [String],
    text: &'a str,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&(String, usize)> {
        self.tokens.get(self.at)
    }

    fn error(&self, at: usize, message: String) -> ExprError {
        ExprError { at, message }
    }

    fn end(&self) -> usize {
        self.text.chars().count()
    }

    /// item (op item)*, left to right, for the comparison and logic ops.
    fn sequence(&mut self) -> Result<Expr, ExprError> {
        let mut left = self.item()?;
        while let Some((t, _)) = self.peek() {
            let op = match t.as_str() {
                ">" => Op::Gt,
                ">=" => Op::Ge,
                "<" => Op::Lt,
                "<=" => Op::Le,
                "==" => Op::Eq,
                "&" => Op::And,
                "|" => Op::Or,
                _ => break,
            };
            self.at += 1;
            let right = self.item()?;
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    /// `( sequence )` or an arithmetic operand.
    fn item(&mut self) -> Result<Expr, ExprError> {
        match self.peek() {
            Some((t, _)) if t == "(" => {
                self.at += 1;
                let e = self.sequence()?;
                match self.peek() {
                    Some((t, _)) if t == ")" => {
                        self.at += 1;
                        Ok(e)
                    }
                    Some((t, at)) => Err(self.error(*at, format!("expected `)`, found `{t}`"))),
                    None => Err(self.error(self.end(), "a `(` is not closed".into())),
                }
            }
            _ => self.sum(),
        }
    }

    fn sum(&mut self) -> Result<Expr, ExprError> {
        let mut left = self.product()?;
        while let Some((t, _)) = self.peek() {
            let op = match t.as_str() {
                "+" => Op::Add,
                "-" => Op::Sub,
                _ => break,
            };
            self.at += 1;
            let right = self.product()?;
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn product(&mut self) -> Result<Expr, ExprError> {
        let mut left = self.factor()?;
        while let Some((t, _)) = self.peek() {
            let op = match t.as_str() {
                "*" => Op::Mul,
                "/" => Op::Div,
                _ => break,
            };
            self.at += 1;
            let right = self.factor()?;
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    /// A name, a number or a negated factor; parentheses cannot open
    /// inside arithmetic (EasyRec would produce broken code).
    fn factor(&mut self) -> Result<Expr, ExprError> {
        let Some((t, at)) = self.peek().cloned() else {
            return Err(self.error(self.end(), "the expression ends where a value is expected".into()));
        };
        self.at += 1;
        if t == "-" {
            return Ok(Expr::Neg(Box::new(self.factor()?)));
        }
        if let Some(i) = self.names.iter().position(|n| *n == t) {
            return Ok(Expr::Input(i));
        }
        if let Ok(x) = t.parse::<f64>() {
            return Ok(Expr::Number(x));
        }
        let what = if t == "(" {
            "parentheses inside arithmetic are not supported (EasyRec cannot run them either)".to_string()
        } else if "+*/)<>&|".contains(t.as_str()) || [">=", "<=", "=="].contains(&t.as_str()) {
            format!("`{t}` where a value is expected")
        } else {
            format!(
                "`{t}` is neither a number nor one of input_names ({})",
                self.names.join(", ")
            )
        };
        Err(self.error(at, what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["age_level".into(), "item_age_level".into()]
    }

    fn eval(text: &str, a: f64, b: f64) -> f64 {
        Expr::parse(text, &names()).unwrap().eval(&[a, b])
    }

    /// EasyRec's own sample expressions (multi_tower_on_taobao_for_expr).
    #[test]
    fn easyrecs_sample_expressions_evaluate_as_tensorflow_would() {
        assert_eq!(eval("age_level>=1", 1.0, 0.0), 1.0);
        assert_eq!(eval("age_level>=1", 0.0, 0.0), 0.0);
        assert_eq!(eval("age_level<(item_age_level+5)", 7.0, 3.0), 1.0);
        assert_eq!(eval("age_level<(item_age_level+5)", 8.0, 3.0), 0.0);
        assert_eq!(eval("age_level==item_age_level", 2.0, 2.0), 1.0);
        let both = "(age_level>=item_age_level) & (age_level<=(item_age_level+5))";
        assert_eq!(eval(both, 4.0, 3.0), 1.0);
        assert_eq!(eval(both, 9.0, 3.0), 0.0);
        let either = "(age_level>=item_age_level) | (age_level>5)";
        assert_eq!(eval(either, 6.0, 9.0), 1.0);
        assert_eq!(eval(either, 2.0, 9.0), 0.0);
    }

    #[test]
    fn arithmetic_has_pythons_precedence_and_logic_runs_left_to_right() {
        assert_eq!(eval("age_level+item_age_level*2-1/2", 1.0, 3.0), 6.5);
        assert_eq!(eval("-age_level+2", 5.0, 0.0), -3.0);
        // EasyRec folds `a>1 & b<2` as ((a>1) & b) < 2.
        assert_eq!(eval("age_level>1 & item_age_level<2", 5.0, 7.0), 1.0);
        assert_eq!(eval("age_level / item_age_level", 1.0, 4.0), 0.25);
    }

    #[test]
    fn what_easyrec_cannot_run_is_refused_with_the_place() {
        let err = |t: &str| Expr::parse(t, &names()).unwrap_err().to_string();
        assert!(
            err("(age_level+1)*2").contains("unexpected `*`"),
            "{}",
            err("(age_level+1)*2")
        );
        assert!(err("age_level=1").contains("`=` alone"));
        assert!(err("age+1").contains("`age` is neither"));
        assert!(err("age_level*(2)").contains("parentheses inside arithmetic"));
        assert!(err("(age_level>1").contains("not closed"));
        assert!(err("age_level>").contains("ends where a value"));
    }
}

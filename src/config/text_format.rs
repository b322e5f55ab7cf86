//! Protobuf text format -> `DynamicMessage`, with the leniencies of Python's
//! `text_format.Merge` that EasyRec uses: a repeated singular field keeps the
//! last value (messages merge), `[a, b]` lists, `:` optional before a message,
//! `{}` or `<>` blocks, `#` comments, quotes of either kind, enums by name or
//! number, `True`/`t`/`1` booleans. Errors carry line:column and, for unknown
//! names, a did-you-mean.

use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage, Value};

use super::suggest;

/// A parse failure at a position of the source text (1-based line and column).
#[derive(Debug, Clone, PartialEq)]
pub struct TextError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Number(String),
    Str(Vec<u8>),
    Punct(char),
    Eof,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Number(s) => format!("number `{s}`"),
            Tok::Str(_) => "a string".to_string(),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::Eof => "end of input".to_string(),
        }
    }
}

struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    line: usize,
    col: usize,
}

impl<'a> Lexer<'a> {
    fn new(src: &'a str) -> Self {
        Lexer {
            src: src.as_bytes(),
            pos: 0,
            line: 1,
            col: 1,
        }
    }

    fn peek_byte(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let b = self.peek_byte()?;
        self.pos += 1;
        if b == b'\n' {
            self.line += 1;
            self.col = 1;
        } else if b & 0xC0 != 0x80 {
            // count characters, not UTF-8 continuation bytes
            self.col += 1;
        }
        Some(b)
    }

    fn err(&self, line: usize, col: usize, message: impl Into<String>) -> TextError {
        TextError {
            line,
            col,
            message: message.into(),
        }
    }

    fn skip_space(&mut self) {
        while let Some(b) = self.peek_byte() {
            if b == b'#' {
                while let Some(b) = self.peek_byte() {
                    if b == b'\n' {
                        break;
                    }
                    self.bump();
                }
            } else if b.is_ascii_whitespace() {
                self.bump();
            } else {
                break;
            }
        }
    }

    /// Next token with the position where it starts.
    fn next(&mut self) -> Result<(Tok, usize, usize), TextError> {
        self.skip_space();
        let (line, col) = (self.line, self.col);
        let Some(b) = self.peek_byte() else {
            return Ok((Tok::Eof, line, col));
        };
        let tok = match b {
            b'{' | b'}' | b'<' | b'>' | b'[' | b']' | b':' | b',' | b';' => {
                self.bump();
                Tok::Punct(b as char)
            }
            b'"' | b'\'' => Tok::Str(self.string(b, line, col)?),
            b'-' | b'.' | b'0'..=b'9' => {
                let start = self.pos;
                self.bump();
                while let Some(c) = self.peek_byte() {
                    let so_far = &self.src[start..self.pos];
                    let hex = so_far.starts_with(b"0x") || so_far.starts_with(b"-0x");
                    let exp_sign = (c == b'+' || c == b'-') && !hex && matches!(so_far.last(), Some(b'e') | Some(b'E'));
                    if c.is_ascii_alphanumeric() || c == b'.' || c == b'_' || exp_sign {
                        self.bump();
                    } else {
                        break;
                    }
                }
                Tok::Number(String::from_utf8_lossy(&self.src[start..self.pos]).into())
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.pos;
                while let Some(c) = self.peek_byte() {
                    if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' {
                        self.bump();
                    } else {
                        break;
                    }
                }
                Tok::Ident(String::from_utf8_lossy(&self.src[start..self.pos]).into())
            }
            _ => {
                let ch = std::str::from_utf8(&self.src[self.pos..])
                    .ok()
                    .and_then(|s| s.chars().next())
                    .unwrap_or('?');
                return Err(self.err(line, col, format!("unexpected character `{ch}`")));
            }
        };
        Ok((tok, line, col))
    }

    fn string(&mut self, quote: u8, line: usize, col: usize) -> Result<Vec<u8>, TextError> {
        self.bump();
        let mut out = Vec::new();
        loop {
            let Some(b) = self.bump() else {
                return Err(self.err(line, col, "unterminated string"));
            };
            match b {
                b'\n' => return Err(self.err(line, col, "unterminated string (newline inside quotes)")),
                b if b == quote => return Ok(out),
                b'\\' => {
                    let (el, ec) = (self.line, self.col);
                    let Some(e) = self.bump() else {
                        return Err(self.err(line, col, "unterminated string"));
                    };
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'a' => out.push(7),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'v' => out.push(11),
                        b'\\' | b'\'' | b'"' | b'?' => out.push(e),
                        b'0'..=b'7' => {
                            let mut v = (e - b'0') as u32;
                            for _ in 0..2 {
                                match self.peek_byte() {
                                    Some(d @ b'0'..=b'7') => {
                                        self.bump();
                                        v = v * 8 + (d - b'0') as u32;
                                    }
                                    _ => break,
                                }
                            }
                            out.push(v as u8);
                        }
                        b'x' | b'X' => {
                            let mut v = 0u32;
                            let mut n = 0;
                            while n < 2 {
                                match self.peek_byte().and_then(|d| (d as char).to_digit(16)) {
                                    Some(d) => {
                                        self.bump();
                                        v = v * 16 + d;
                                        n += 1;
                                    }
                                    None => break,
                                }
                            }
                            if n == 0 {
                                return Err(self.err(el, ec, "`\\x` escape without hex digits"));
                            }
                            out.push(v as u8);
                        }
                        b'u' | b'U' => {
                            let len = if e == b'u' { 4 } else { 8 };
                            let mut v = 0u32;
                            for _ in 0..len {
                                match self.bump().and_then(|d| (d as char).to_digit(16)) {
                                    Some(d) => v = v * 16 + d,
                                    None => return Err(self.err(el, ec, "bad unicode escape")),
                                }
                            }
                            let c = char::from_u32(v).ok_or_else(|| self.err(el, ec, "bad unicode escape"))?;
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                        }
                        other => {
                            return Err(self.err(el, ec, format!("unknown escape `\\{}` in string", other as char)))
                        }
                    }
                }
                b => out.push(b),
            }
        }
    }
}

/// Parses `text` as a message of type `desc`, merging into `msg`, as
/// Python's `text_format.Merge` (which EasyRec reads configs with) does:
/// a member of a oneof replaces another member set before it. Returns a
/// warning, at its place, for each such replacement.
pub fn merge_text_warning(msg: &mut DynamicMessage, text: &str) -> Result<Vec<TextError>, TextError> {
    let mut p = Parser {
        lex: Lexer::new(text),
        peeked: None,
        path: Vec::new(),
        outer: Vec::new(),
        warnings: Vec::new(),
    };
    p.message_body(msg, None)?;
    Ok(p.warnings)
}

/// `merge_text_warning`, its warnings logged with their line and column.
pub fn merge_text(msg: &mut DynamicMessage, text: &str) -> Result<(), TextError> {
    for w in merge_text_warning(msg, text)? {
        log::warn!("{}:{}: {}", w.line, w.col, w.message);
    }
    Ok(())
}

/// Parses `text` into a fresh message of type `desc`, with the warnings
/// of `merge_text_warning`.
pub fn parse_text_warning(desc: &MessageDescriptor, text: &str) -> Result<(DynamicMessage, Vec<TextError>), TextError> {
    let mut msg = DynamicMessage::new(desc.clone());
    let warnings = merge_text_warning(&mut msg, text)?;
    Ok((msg, warnings))
}

/// Parses `text` into a fresh message of type `desc` (`merge_text`).
pub fn parse_text(desc: &MessageDescriptor, text: &str) -> Result<DynamicMessage, TextError> {
    let mut msg = DynamicMessage::new(desc.clone());
    merge_text(&mut msg, text)?;
    Ok(msg)
}

struct Parser<'a> {
    lex: Lexer<'a>,
    peeked: Option<(Tok, usize, usize)>,
    /// Field names from the root to the message being parsed, for messages.
    path: Vec<String>,
    /// Types of the enclosing messages, to spot a missing `}`.
    outer: Vec<MessageDescriptor>,
    /// What was accepted with a warning (a oneof member replaced).
    warnings: Vec<TextError>,
}

impl Parser<'_> {
    fn next(&mut self) -> Result<(Tok, usize, usize), TextError> {
        match self.peeked.take() {
            Some(t) => Ok(t),
            None => self.lex.next(),
        }
    }

    fn peek(&mut self) -> Result<&Tok, TextError> {
        if self.peeked.is_none() {
            self.peeked = Some(self.lex.next()?);
        }
        Ok(&self.peeked.as_ref().expect("peeked").0)
    }

    fn err(line: usize, col: usize, message: impl Into<String>) -> TextError {
        TextError {
            line,
            col,
            message: message.into(),
        }
    }

    fn here(&self) -> String {
        if self.path.is_empty() {
            "the top level".to_string()
        } else {
            format!("`{}`", self.path.join("."))
        }
    }

    /// Fields until `close` (or end of input when `close` is None).
    fn message_body(&mut self, msg: &mut DynamicMessage, close: Option<char>) -> Result<(), TextError> {
        loop {
            let (tok, line, col) = self.next()?;
            match tok {
                Tok::Eof => {
                    return match close {
                        None => Ok(()),
                        Some(c) => Err(Self::err(line, col, format!("missing `{c}` before end of input"))),
                    }
                }
                Tok::Punct(c) if Some(c) == close => return Ok(()),
                Tok::Ident(name) => {
                    self.field(msg, &name, line, col)?;
                    if matches!(self.peek()?, Tok::Punct(',') | Tok::Punct(';')) {
                        self.next()?;
                    }
                }
                Tok::Punct('[') => {
                    return Err(Self::err(
                        line,
                        col,
                        "extension and Any fields (`[...]`) are not supported in pipeline configs",
                    ))
                }
                other => {
                    return Err(Self::err(
                        line,
                        col,
                        format!("expected a field name in {}, found {}", self.here(), other.describe()),
                    ))
                }
            }
        }
    }

    fn field(&mut self, msg: &mut DynamicMessage, name: &str, line: usize, col: usize) -> Result<(), TextError> {
        let desc = msg.descriptor();
        let Some(fd) = desc.get_field_by_name(name) else {
            let names: Vec<String> = desc.fields().map(|f| f.name().to_string()).collect();
            let mut message = suggest::unknown_field_message(name, &self.path, desc.full_name(), &names);
            if let Some(depth) = self.outer.iter().rposition(|m| m.get_field_by_name(name).is_some()) {
                message.push_str(&format!(
                    " (it belongs to {}: is a `}}` missing before it?)",
                    if depth == 0 {
                        "the top level".to_string()
                    } else {
                        format!("`{}`", self.path[..depth].join("."))
                    }
                ));
            }
            return Err(Self::err(line, col, message));
        };
        if let Some(oneof) = fd.containing_oneof() {
            if let Some(other) = oneof.fields().find(|o| o.number() != fd.number() && msg.has_field(o)) {
                // EasyRec's parser keeps the member set last.
                self.warnings.push(Self::err(
                    line,
                    col,
                    format!(
                        "`{name}` replaces `{}`, another member of oneof `{}` in {} set before it, as EasyRec's \
                         parser does; set only one",
                        other.name(),
                        oneof.name(),
                        self.here()
                    ),
                ));
                msg.clear_field(&other);
            }
        }
        let is_msg = matches!(fd.kind(), Kind::Message(_));
        let has_colon = matches!(self.peek()?, Tok::Punct(':'));
        if has_colon {
            self.next()?;
        }
        if !is_msg && !has_colon {
            let (t, l, c) = self.next()?;
            return Err(Self::err(
                l,
                c,
                format!("expected `:` after `{name}`, found {}", t.describe()),
            ));
        }
        if matches!(self.peek()?, Tok::Punct('[')) {
            let (_, l, c) = self.next()?;
            if !fd.is_list() && !fd.is_map() {
                return Err(Self::err(
                    l,
                    c,
                    format!("`{name}` is not repeated, so it takes one value, not a `[...]` list"),
                ));
            }
            if matches!(self.peek()?, Tok::Punct(']')) {
                self.next()?;
                // `name: []` still marks presence of nothing; keep the list as is
                return Ok(());
            }
            loop {
                self.one_value(msg, &fd)?;
                let (t, l, c) = self.next()?;
                match t {
                    Tok::Punct(',') => continue,
                    Tok::Punct(']') => break,
                    other => {
                        return Err(Self::err(
                            l,
                            c,
                            format!(
                                "expected `,` or `]` in the list of `{name}`, found {}",
                                other.describe()
                            ),
                        ))
                    }
                }
            }
            Ok(())
        } else {
            self.one_value(msg, &fd)
        }
    }

    /// One value (scalar or `{...}` message) for `fd`, appended when repeated.
    fn one_value(&mut self, msg: &mut DynamicMessage, fd: &FieldDescriptor) -> Result<(), TextError> {
        if let Kind::Message(sub_desc) = fd.kind() {
            let (t, l, c) = self.next()?;
            let close = match t {
                Tok::Punct('{') => '}',
                Tok::Punct('<') => '>',
                other => {
                    return Err(Self::err(
                        l,
                        c,
                        format!(
                            "expected `{{` to open message `{}`, found {}",
                            fd.name(),
                            other.describe()
                        ),
                    ))
                }
            };
            self.path.push(fd.name().to_string());
            self.outer.push(msg.descriptor());
            let result = if fd.is_map() {
                // A map entry is written as a message of `key` and `value`.
                let mut entry = DynamicMessage::new(sub_desc.clone());
                self.message_body(&mut entry, Some(close)).map(|_| {
                    let key = entry.get_field(&sub_desc.map_entry_key_field()).into_owned();
                    let value = entry.get_field(&sub_desc.map_entry_value_field()).into_owned();
                    if let (Value::Map(map), Some(key)) = (msg.get_field_mut(fd), map_key(key)) {
                        map.insert(key, value);
                    }
                })
            } else if fd.is_list() {
                let mut sub = DynamicMessage::new(sub_desc);
                self.message_body(&mut sub, Some(close)).map(|_| {
                    if let Value::List(items) = msg.get_field_mut(fd) {
                        items.push(Value::Message(sub));
                    }
                })
            } else {
                match msg.get_field_mut(fd) {
                    Value::Message(sub) => self.message_body(sub, Some(close)),
                    _ => unreachable!("message field holds a message"),
                }
            };
            self.path.pop();
            self.outer.pop();
            return result;
        }
        let (t, l, c) = self.next()?;
        let value = scalar_from_token(fd, &t).map_err(|m| Self::err(l, c, m))?;
        if fd.is_list() {
            if let Value::List(items) = msg.get_field_mut(fd) {
                items.push(value);
            }
        } else {
            msg.set_field(fd, value);
        }
        Ok(())
    }
}

/// A map entry's key as a map key (keys are scalars, never floats).
fn map_key(v: Value) -> Option<MapKey> {
    Some(match v {
        Value::String(s) => MapKey::String(s),
        Value::Bool(b) => MapKey::Bool(b),
        Value::I32(x) => MapKey::I32(x),
        Value::I64(x) => MapKey::I64(x),
        Value::U32(x) => MapKey::U32(x),
        Value::U64(x) => MapKey::U64(x),
        _ => return None,
    })
}

fn scalar_from_token(fd: &FieldDescriptor, tok: &Tok) -> Result<Value, String> {
    let name = fd.name();
    let text = match tok {
        Tok::Ident(s) | Tok::Number(s) => s.clone(),
        Tok::Str(bytes) => {
            return match fd.kind() {
                Kind::String => String::from_utf8(bytes.clone())
                    .map(Value::String)
                    .map_err(|_| format!("`{name}` must be valid UTF-8 text")),
                Kind::Bytes => Ok(Value::Bytes(bytes.clone().into())),
                _ => Err(format!("`{name}` takes {}, not a quoted string", kind_name(&fd.kind()))),
            }
        }
        other => return Err(format!("expected a value for `{name}`, found {}", other.describe())),
    };
    let kind = fd.kind();
    if matches!(kind, Kind::String | Kind::Bytes) {
        return Err(format!("`{name}` takes a quoted string, found `{text}`"));
    }
    scalar_from_str(fd, &text, true)
}

/// Converts unquoted text to a value of `fd`'s scalar kind. `text_rules`
/// selects protobuf text-format spellings (`t`, `1` booleans, hex ints);
/// without it, the stricter rules of EasyRec's `--edit_config_json` apply.
pub fn scalar_from_str(fd: &FieldDescriptor, text: &str, text_rules: bool) -> Result<Value, String> {
    let name = fd.name();
    let kind = fd.kind();
    let bad = |what: &str| format!("`{name}` takes {what}, found `{text}`");
    match kind {
        Kind::Bool => {
            let v = match text {
                "true" | "True" => Some(true),
                "false" | "False" => Some(false),
                "t" | "1" if text_rules => Some(true),
                "f" | "0" if text_rules => Some(false),
                _ => None,
            };
            v.map(Value::Bool).ok_or_else(|| bad("true or false"))
        }
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => parse_int(text, text_rules)
            .and_then(|v| i32::try_from(v).ok())
            .map(Value::I32)
            .ok_or_else(|| bad("a 32-bit integer")),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => parse_int(text, text_rules)
            .and_then(|v| i64::try_from(v).ok())
            .map(Value::I64)
            .ok_or_else(|| bad("a 64-bit integer")),
        Kind::Uint32 | Kind::Fixed32 => parse_int(text, text_rules)
            .and_then(|v| u32::try_from(v).ok())
            .map(Value::U32)
            .ok_or_else(|| bad("a non-negative 32-bit integer")),
        Kind::Uint64 | Kind::Fixed64 => parse_int(text, text_rules)
            .and_then(|v| u64::try_from(v).ok())
            .map(Value::U64)
            .ok_or_else(|| bad("a non-negative integer")),
        Kind::Float => parse_float(text)
            .map(|v| Value::F32(v as f32))
            .ok_or_else(|| bad("a number")),
        Kind::Double => parse_float(text).map(Value::F64).ok_or_else(|| bad("a number")),
        Kind::String => Ok(Value::String(text.to_string())),
        Kind::Bytes => Ok(Value::Bytes(text.as_bytes().to_vec().into())),
        Kind::Enum(e) => {
            if let Some(v) = e.get_value_by_name(text) {
                return Ok(Value::EnumNumber(v.number()));
            }
            if let Some(n) = parse_int(text, text_rules).and_then(|v| i32::try_from(v).ok()) {
                if e.get_value(n).is_some() {
                    return Ok(Value::EnumNumber(n));
                }
            }
            if let Some(msg) = suggest::easyrec_only_enum_value(text, name, e.full_name()) {
                return Err(msg);
            }
            let names: Vec<String> = e.values().map(|v| v.name().to_string()).collect();
            let hint = suggest::did_you_mean(text, &names);
            let stop = if hint.is_empty() { "." } else { "" };
            Err(format!(
                "unknown value `{text}` for `{name}` (enum {}){hint}{stop} Expected one of: {}",
                e.full_name(),
                names.join(", ")
            ))
        }
        Kind::Message(_) => Err(format!("`{name}` is a message; write `{name} {{ ... }}`")),
    }
}

fn parse_int(text: &str, text_rules: bool) -> Option<i128> {
    let (neg, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let v = if text_rules && (body.starts_with("0x") || body.starts_with("0X")) {
        i128::from_str_radix(&body[2..], 16).ok()?
    } else if text_rules && body.len() > 1 && body.starts_with('0') {
        i128::from_str_radix(&body[1..], 8).ok()?
    } else {
        if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        body.parse::<i128>().ok()?
    };
    Some(if neg { -v } else { v })
}

fn parse_float(text: &str) -> Option<f64> {
    let lower = text.to_ascii_lowercase();
    match lower.as_str() {
        "inf" | "infinity" | "inff" => return Some(f64::INFINITY),
        "-inf" | "-infinity" | "-inff" => return Some(f64::NEG_INFINITY),
        "nan" | "-nan" | "nanf" => return Some(f64::NAN),
        _ => {}
    }
    // `1.5f` is a float in text format
    let t = lower.strip_suffix('f').unwrap_or(&lower);
    let digits = t
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'+' | b'-'));
    if t.is_empty() || !digits {
        return None;
    }
    t.parse::<f64>().ok()
}

fn kind_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::Bool => "true or false",
        Kind::Float | Kind::Double => "a number",
        Kind::Enum(_) => "an enum value name",
        Kind::Message(_) => "a `{ ... }` block",
        Kind::String | Kind::Bytes => "a quoted string",
        _ => "an integer",
    }
}

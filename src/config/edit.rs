//! EasyRec's `--edit_config_json`: dotted paths from the root with selectors
//! `[:]`, `[i]`, `[i:j]` (Python slices) and conditions `[key<op>value]`
//! (`>=`, `<=`, `>`, `<`, `=`), applied to the reflective config.
//! Scalars are converted like EasyRec's `_type_convert`; a repeated scalar
//! target takes text such as `[48, 24]`; a message target takes text proto.

use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, ReflectMessage, Value};

use super::{suggest, text_format, ConfigError};

#[derive(Debug, Clone)]
enum Step {
    Field(FieldDescriptor),
    Index(usize),
}

/// Applies `(key, value)` pairs in order. A key `"a;b"` with value `"x;y"`
/// sets `a` to x and `b` to y.
pub fn apply_edits(root: &mut DynamicMessage, edits: &[(String, String)]) -> Result<(), ConfigError> {
    for (keys, vals) in edits {
        let keys: Vec<&str> = keys.split(';').map(str::trim).collect();
        let vals: Vec<&str> = vals.split(';').map(str::trim).collect();
        if keys.len() != vals.len() {
            return Err(ConfigError::Edit {
                key: keys.join(";"),
                message: format!("{} keys but {} values separated by `;`", keys.len(), vals.len()),
            });
        }
        for (key, val) in keys.iter().zip(vals) {
            apply_one(root, key, val).map_err(|message| ConfigError::Edit {
                key: key.to_string(),
                message,
            })?;
        }
    }
    Ok(())
}

/// Converts a JSON value to the string EasyRec would see (`str()` in Python).
pub fn python_str(v: &serde_json::Value) -> String {
    fn repr(v: &serde_json::Value, nested: bool) -> String {
        match v {
            serde_json::Value::Null => "None".into(),
            serde_json::Value::Bool(b) => if *b { "True" } else { "False" }.into(),
            serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => i.to_string(),
                (_, Some(u), _) => u.to_string(),
                (_, _, Some(f)) if f.fract() == 0.0 && f.abs() < 1e16 => format!("{f:.1}"),
                (_, _, Some(f)) => format!("{f}"),
                _ => n.to_string(),
            },
            serde_json::Value::String(s) if nested => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(a) => {
                format!("[{}]", a.iter().map(|x| repr(x, true)).collect::<Vec<_>>().join(", "))
            }
            serde_json::Value::Object(o) => format!(
                "{{{}}}",
                o.iter()
                    .map(|(k, x)| format!("'{k}': {}", repr(x, true)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    repr(v, false)
}

fn apply_one(root: &mut DynamicMessage, key: &str, val: &str) -> Result<(), String> {
    let targets = resolve(root, key)?;
    if targets.is_empty() {
        return Err("the path selects no element".to_string());
    }
    let mut holder = Value::Message(std::mem::replace(root, DynamicMessage::new(root.descriptor())));
    let mut result = Ok(());
    for path in &targets {
        result = set_at(&mut holder, path, val);
        if result.is_err() {
            break;
        }
    }
    let Value::Message(m) = holder else {
        unreachable!("root holder is a message")
    };
    *root = m;
    result
}

/// Splits `a.b[x.y=1].c` at dots outside brackets.
fn split_key(key: &str) -> Result<Vec<(String, Option<String>)>, String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for ch in key.chars() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return Err("unbalanced `]`".into());
        }
        if ch == '.' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    if depth != 0 {
        return Err("unbalanced `[`".into());
    }
    parts.push(cur);
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .map(|p| match p.find('[') {
            None => Ok((p, None)),
            Some(pos) => {
                if !p.ends_with(']') {
                    return Err(format!("`{p}`: a selector must close the segment"));
                }
                Ok((p[..pos].trim().to_string(), Some(p[pos + 1..p.len() - 1].to_string())))
            }
        })
        .collect()
}

/// The value at `path` (unset fields read as their defaults), cloning only that value.
fn read(root: &DynamicMessage, path: &[Step]) -> Option<Value> {
    fn walk(cur: &Value, path: &[Step]) -> Option<Value> {
        let Some((step, rest)) = path.split_first() else {
            return Some(cur.clone());
        };
        match (step, cur) {
            (Step::Field(fd), Value::Message(m)) => walk(&m.get_field(fd), rest),
            (Step::Index(i), Value::List(items)) => walk(items.get(*i)?, rest),
            _ => None,
        }
    }
    match path.split_first() {
        None => Some(Value::Message(root.clone())),
        Some((Step::Field(fd), rest)) => walk(&root.get_field(fd), rest),
        Some((Step::Index(_), _)) => None,
    }
}

fn describe(path: &[Step]) -> String {
    let mut s = String::new();
    for step in path {
        match step {
            Step::Field(fd) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(fd.name());
            }
            Step::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    if s.is_empty() {
        "<root>".into()
    } else {
        s
    }
}

fn resolve(root: &DynamicMessage, key: &str) -> Result<Vec<Vec<Step>>, String> {
    let tokens = split_key(key)?;
    if tokens.is_empty() {
        return Err("empty path".into());
    }
    let mut paths: Vec<Vec<Step>> = vec![Vec::new()];
    for (name, selector) in tokens {
        let mut next = Vec::new();
        for path in paths {
            let msg = match read(root, &path) {
                Some(Value::Message(m)) => m,
                Some(Value::List(_)) => {
                    return Err(format!(
                        "`{}` is repeated: select elements with [i], [:], [i:j] or [field=value] before `.{name}`",
                        describe(&path)
                    ))
                }
                _ => {
                    return Err(format!(
                        "`{}` is not a message, so it has no field `{name}`",
                        describe(&path)
                    ))
                }
            };
            let desc = msg.descriptor();
            let Some(fd) = desc.get_field_by_name(&name) else {
                let names: Vec<String> = desc.fields().map(|f| f.name().to_string()).collect();
                let where_ = if path.is_empty() {
                    "the pipeline config".to_string()
                } else {
                    format!("`{}`", describe(&path))
                };
                return Err(format!(
                    "no field `{name}` in {where_}{}",
                    suggest::did_you_mean(&name, &names)
                ));
            };
            let mut field_path = path.clone();
            field_path.push(Step::Field(fd.clone()));
            let Some(sel) = selector.clone() else {
                next.push(field_path);
                continue;
            };
            if !fd.is_list() {
                return Err(format!(
                    "`{}` is not repeated, so `[{sel}]` cannot select from it",
                    describe(&field_path)
                ));
            }
            let len = match read(root, &field_path) {
                Some(Value::List(items)) => items.len(),
                _ => 0,
            };
            for i in select(root, &field_path, &sel, len)? {
                let mut p = field_path.clone();
                p.push(Step::Index(i));
                next.push(p);
            }
        }
        paths = next;
    }
    Ok(paths)
}

/// Indices of a repeated field picked by a selector.
fn select(root: &DynamicMessage, list_path: &[Step], sel: &str, len: usize) -> Result<Vec<usize>, String> {
    let sel_t = sel.trim();
    if sel_t == ":" {
        return Ok((0..len).collect());
    }
    let py_index = |v: i64| -> usize {
        if v < 0 {
            (len as i64 + v).max(0) as usize
        } else {
            (v as usize).min(len)
        }
    };
    if let Some((a, b)) = sel_t.split_once(':') {
        let parse = |s: &str| {
            if s.trim().is_empty() {
                Ok(None)
            } else {
                s.trim().parse::<i64>().map(Some)
            }
        };
        if let (Ok(a), Ok(b)) = (parse(a), parse(b)) {
            let start = a.map_or(0, py_index);
            let end = b.map_or(len, py_index);
            return Ok((start..end.max(start)).collect());
        }
    }
    if let Ok(i) = sel_t.parse::<i64>() {
        let idx = if i < 0 { len as i64 + i } else { i };
        if idx < 0 || idx as usize >= len {
            return Err(format!(
                "index [{i}] is out of range: `{}` has {len} elements",
                describe(list_path)
            ));
        }
        return Ok(vec![idx as usize]);
    }
    // condition: the first operator (in this order) found, at its last occurrence
    let (op, pos) = [">=", "<=", ">", "<", "="]
        .iter()
        .find_map(|op| sel.rfind(op).map(|p| (*op, p)))
        .ok_or_else(|| format!("invalid selector `[{sel}]`: expected :, i, i:j or field<op>value"))?;
    let cond_key = sel[..pos].trim();
    let cond_val = sel[pos + op.len()..].trim();
    let mut hits = Vec::new();
    for i in 0..len {
        let mut elem = list_path.to_vec();
        elem.push(Step::Index(i));
        let Some(Value::Message(m)) = read(root, &elem) else {
            return Err(format!(
                "`{}` holds scalars; conditions select messages",
                describe(list_path)
            ));
        };
        let sub = resolve(&m, cond_key).map_err(|e| format!("in condition `[{sel}]`: {e}"))?;
        let Some(last) = sub.last() else { continue };
        let Some(actual) = read(&m, last) else { continue };
        let fd = last.iter().rev().find_map(|s| match s {
            Step::Field(fd) => Some(fd.clone()),
            Step::Index(_) => None,
        });
        let Some(fd) = fd else { continue };
        let expected =
            text_format::scalar_from_str(&fd, cond_val, false).map_err(|e| format!("in condition `[{sel}]`: {e}"))?;
        if compare(&actual, &expected, op).map_err(|e| format!("in condition `[{sel}]`: {e}"))? {
            hits.push(i);
        }
    }
    Ok(hits)
}

fn compare(a: &Value, b: &Value, op: &str) -> Result<bool, String> {
    use std::cmp::Ordering;
    let ord = match (a, b) {
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::EnumNumber(x), Value::EnumNumber(y)) => x.cmp(y),
        _ => {
            let (x, y) = (as_f64(a), as_f64(b));
            match (x, y) {
                (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Less),
                _ => return Err("the condition must compare a scalar field".into()),
            }
        }
    };
    Ok(match op {
        "=" => ord == Ordering::Equal,
        ">" => ord == Ordering::Greater,
        "<" => ord == Ordering::Less,
        ">=" => ord != Ordering::Less,
        _ => ord != Ordering::Greater,
    })
}

fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::I32(x) => Some(*x as f64),
        Value::I64(x) => Some(*x as f64),
        Value::U32(x) => Some(*x as f64),
        Value::U64(x) => Some(*x as f64),
        Value::F32(x) => Some(*x as f64),
        Value::F64(x) => Some(*x),
        _ => None,
    }
}

fn get_mut<'a>(cur: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    let Some((step, rest)) = path.split_first() else {
        return Some(cur);
    };
    let next = match (step, cur) {
        (Step::Field(fd), Value::Message(m)) => m.get_field_mut(fd),
        (Step::Index(i), Value::List(items)) => items.get_mut(*i)?,
        _ => return None,
    };
    get_mut(next, rest)
}

/// Text proto for a message target: EasyRec strips one pair of outer braces.
fn message_text(val: &str) -> &str {
    let v = val.trim();
    if v.starts_with('{') && v.ends_with('}') {
        &v[1..v.len() - 1]
    } else {
        v
    }
}

fn parse_message(fd: &FieldDescriptor, val: &str) -> Result<DynamicMessage, String> {
    let Kind::Message(desc) = fd.kind() else {
        unreachable!("message field")
    };
    text_format::parse_text(&desc, message_text(val))
        .map_err(|e| format!("value for `{}`: {}:{}: {}", fd.name(), e.line, e.col, e.message))
}

fn set_at(root: &mut Value, path: &[Step], val: &str) -> Result<(), String> {
    let where_ = describe(path);
    let (last, parent_path) = path.split_last().expect("non-empty path");
    match last {
        Step::Field(fd) => {
            let parent = get_mut(root, parent_path).ok_or_else(|| format!("cannot reach `{where_}`"))?;
            let Value::Message(parent) = parent else {
                return Err(format!("cannot reach `{where_}`"));
            };
            if fd.is_list() {
                // `name: [1, 2]`, `name: 5`, `name { ... }` or `name: [{...}, {...}]`
                let mut fresh = DynamicMessage::new(parent.descriptor());
                let text = format!("{}: {}", fd.name(), val);
                text_format::merge_text(&mut fresh, &text)
                    .map_err(|e| format!("value `{val}` for `{where_}`: {}", e.message))?;
                parent.set_field(fd, fresh.get_field(fd).into_owned());
            } else if matches!(fd.kind(), Kind::Message(_)) {
                let m = parse_message(fd, val)?;
                parent.set_field(fd, Value::Message(m));
            } else {
                let v = text_format::scalar_from_str(fd, val, false).map_err(|e| format!("at `{where_}`: {e}"))?;
                parent.set_field(fd, v);
            }
        }
        Step::Index(i) => {
            let Some(Step::Field(fd)) = parent_path.last() else {
                unreachable!("index follows a field")
            };
            let new = if matches!(fd.kind(), Kind::Message(_)) {
                Value::Message(parse_message(fd, val)?)
            } else {
                text_format::scalar_from_str(fd, val, false).map_err(|e| format!("at `{where_}`: {e}"))?
            };
            let slot = get_mut(root, parent_path).ok_or_else(|| format!("cannot reach `{where_}`"))?;
            let Value::List(items) = slot else {
                return Err(format!("`{where_}` is not a list"));
            };
            items[*i] = new;
        }
    }
    Ok(())
}

//! The config as a reflective message, for checks that go by field names
//! and paths rather than by each message's prost struct: required fields,
//! size claims, learning-rate numbers.

use prost_reflect::{DynamicMessage, ReflectMessage, Value};

use super::ConfigError;

/// `m` (a generated prost struct) as a `DynamicMessage` of the schema's
/// message `type_name` (e.g. `protos.LearningRate`).
pub fn dynamic<M: prost::Message>(m: &M, type_name: &str) -> Result<DynamicMessage, ConfigError> {
    let desc = super::schema()
        .get_message_by_name(type_name)
        .ok_or_else(|| ConfigError::invalid("<root>", format!("internal error: no message {type_name}")))?;
    DynamicMessage::decode(desc, m.encode_to_vec().as_slice())
        .map_err(|e| ConfigError::invalid("<root>", format!("internal transcoding error: {e}")))
}

/// `path.name`, or `name` at the root.
pub fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// Calls `f(message, path)` for `msg` and every message set below it,
/// parents first; paths read `a.b[2].c`. Stops at the first error.
pub fn visit<E>(
    msg: &DynamicMessage,
    path: &str,
    f: &mut dyn FnMut(&DynamicMessage, &str) -> Result<(), E>,
) -> Result<(), E> {
    f(msg, path)?;
    for fd in msg.descriptor().fields() {
        if !msg.has_field(&fd) {
            continue;
        }
        let here = join(path, fd.name());
        match &*msg.get_field(&fd) {
            Value::Message(m) => visit(m, &here, f)?,
            Value::List(items) => {
                for (i, item) in items.iter().enumerate() {
                    if let Value::Message(m) = item {
                        visit(m, &format!("{here}[{i}]"), f)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

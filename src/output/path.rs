//! One delta action applied at one path inside a JSON value: the arithmetic of the reducer.
//!
//! Kept apart from `reducer.rs` so the rules fit on one screen. Every check happens before anything is
//! changed, so an action that fails leaves the value as it was: the reducer relies on that to refuse a bad
//! delta without damaging the message's state. Objects are created on the way only by `set`; the others
//! need the parent to exist (a missing leaf is fine: appending to nothing starts the value). A segment that
//! is a number indexes an array.

use serde_json::Value;

use super::message::DeltaAction;

/// Why an action could not apply; the reducer adds the message and the full path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathError {
    /// The value there (or the delta's value) cannot take this action, e.g. append to a number.
    Conflict { target: &'static str, value: &'static str },
    /// A segment on the way is missing (and the action is not `set`) or is not an object or array.
    NoParent { segment: String },
}

/// A value's JSON kind with its article, for error messages.
pub(crate) fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A path segment as an array index: decimal digits only.
fn index(segment: &str) -> Option<usize> {
    if segment.is_empty() || !segment.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    segment.parse().ok()
}

/// The value at `path` inside `root`, if there is one.
pub(crate) fn get<'a>(root: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(root, |node, segment| match node {
        Value::Object(map) => map.get(*segment),
        Value::Array(items) => index(segment).and_then(|i| items.get(i)),
        _ => None,
    })
}

/// The value at `path` inside `root`, mutably.
pub(crate) fn get_mut<'a>(root: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    path.iter().try_fold(root, |node, segment| match node {
        Value::Object(map) => map.get_mut(*segment),
        Value::Array(items) => index(segment).and_then(|i| items.get_mut(i)),
        _ => None,
    })
}

/// Applies `action` with `value` at `path` inside `root` (an empty path is `root` itself).
pub(crate) fn apply(root: &mut Value, path: &[&str], action: DeltaAction, value: &Value) -> Result<(), PathError> {
    let Some((leaf, parents)) = path.split_last() else {
        check(Some(root), action, value)?;
        write(root, action, value);
        return Ok(());
    };
    let mut node = root;
    for segment in parents {
        node = child(node, segment, action == DeltaAction::Set)?;
    }
    match node {
        Value::Object(map) => {
            check(map.get(*leaf), action, value)?;
            match map.get_mut(*leaf) {
                Some(slot) => write(slot, action, value),
                None => {
                    map.insert((*leaf).to_owned(), value.clone());
                }
            }
            Ok(())
        }
        Value::Array(items) => {
            let index = array_index(leaf, items.len())?;
            check(items.get(index), action, value)?;
            match items.get_mut(index) {
                Some(slot) => write(slot, action, value),
                None => items.push(value.clone()),
            }
            Ok(())
        }
        _ => Err(PathError::NoParent { segment: (*leaf).to_owned() }),
    }
}

/// Steps into `segment`, creating an object there when `create` and it is missing.
fn child<'a>(node: &'a mut Value, segment: &str, create: bool) -> Result<&'a mut Value, PathError> {
    let missing = || PathError::NoParent { segment: segment.to_owned() };
    match node {
        Value::Object(map) => {
            let present = map.get(segment).is_some_and(|v| !v.is_null());
            if !present {
                if !create {
                    return Err(missing());
                }
                map.insert(segment.to_owned(), Value::Object(Default::default()));
            }
            map.get_mut(segment).ok_or_else(missing)
        }
        Value::Array(items) => {
            let index = array_index(segment, items.len())?;
            items.get_mut(index).ok_or_else(missing)
        }
        _ => Err(missing()),
    }
}

/// A segment as an array index; one past the end is allowed (it appends).
fn array_index(segment: &str, len: usize) -> Result<usize, PathError> {
    match index(segment) {
        Some(i) if i <= len => Ok(i),
        _ => Err(PathError::NoParent { segment: segment.to_owned() }),
    }
}

/// Can `action` with `value` apply to `target` (`None`: nothing there yet)?
fn check(target: Option<&Value>, action: DeltaAction, value: &Value) -> Result<(), PathError> {
    let target = target.filter(|v| !v.is_null());
    let conflict = || PathError::Conflict { target: target.map_or("nothing", kind_name), value: kind_name(value) };
    let ok = match (action, target) {
        (DeltaAction::Replace | DeltaAction::Set, _) => true,
        (DeltaAction::Append, None) => true,
        (DeltaAction::Append, Some(Value::String(_))) => value.is_string(),
        (DeltaAction::Append, Some(Value::Array(_))) => true,
        (DeltaAction::Append, Some(_)) => false,
        (DeltaAction::Merge, None | Some(Value::Object(_))) => value.is_object(),
        (DeltaAction::Merge, Some(_)) => false,
    };
    if ok { Ok(()) } else { Err(conflict()) }
}

/// Performs an action `check` accepted.
fn write(target: &mut Value, action: DeltaAction, value: &Value) {
    match (action, &mut *target, value) {
        (DeltaAction::Append, Value::String(s), Value::String(tail)) => s.push_str(tail),
        (DeltaAction::Append, Value::Array(items), Value::Array(more)) => items.extend(more.iter().cloned()),
        (DeltaAction::Append, Value::Array(items), one) => items.push(one.clone()),
        (DeltaAction::Merge, Value::Object(map), Value::Object(more)) => {
            for (key, v) in more {
                map.insert(key.clone(), v.clone());
            }
        }
        _ => *target = value.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn failures_change_nothing() {
        let mut root = json!({"a": {"n": 1, "s": "x"}, "list": [1]});
        let before = root.clone();
        let bad = [
            (vec!["a", "n"], DeltaAction::Append, json!("y")),
            (vec!["a", "s"], DeltaAction::Append, json!(1)),
            (vec!["a", "s"], DeltaAction::Merge, json!({"k": 1})),
            (vec!["a", "n", "deep"], DeltaAction::Set, json!(1)),
            (vec!["missing", "x"], DeltaAction::Replace, json!(1)),
            (vec!["list", "5"], DeltaAction::Set, json!(1)),
            (vec![], DeltaAction::Append, json!({"k": 1})),
            (vec![], DeltaAction::Merge, json!("text")),
        ];
        for (path, action, value) in bad {
            assert!(apply(&mut root, &path, action, &value).is_err(), "{path:?} {action:?}");
            assert_eq!(root, before);
        }
    }

    #[test]
    fn set_creates_the_way() {
        let mut root = json!({});
        apply(&mut root, &["a", "b", "c"], DeltaAction::Set, &json!(1)).expect("set");
        assert_eq!(root, json!({"a": {"b": {"c": 1}}}));
        apply(&mut root, &["a", "list"], DeltaAction::Append, &json!([1, 2])).expect("append new");
        apply(&mut root, &["a", "list", "2"], DeltaAction::Append, &json!(3)).expect("append index");
        apply(&mut root, &["a", "list"], DeltaAction::Append, &json!(4)).expect("push one");
        assert_eq!(root, json!({"a": {"b": {"c": 1}, "list": [1, 2, 3, 4]}}));
    }
}

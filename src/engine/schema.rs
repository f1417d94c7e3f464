//! Tools' parameter schemas (`parameters_json`, a JSON Schema): checked
//! when a tool is registered, and applied to every call proposed for it
//! before anyone is asked to approve it or a worker gets it. A schema may
//! not refer to other documents: the server never fetches one.
//!
//! Checking a call is a pure function of the schema and the arguments, so
//! the fold may do it: compiled schemas are kept in a small cache, by the
//! schema's canonical text.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::domain::event::canonical_json;

/// Compiled schemas kept: one per registered tool, in practice.
const CACHED: usize = 256;
/// At most this many of a call's violations are reported.
const MOST_REPORTED: usize = 10;

type Cache = Mutex<lru::LruCache<String, Arc<jsonschema::Validator>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| {
        Mutex::new(lru::LruCache::new(
            NonZeroUsize::new(CACHED).expect("non-zero"),
        ))
    })
}

/// Why `schema` cannot check calls, if it cannot: not a valid JSON Schema,
/// or one that refers to another document.
pub fn check(schema: &Value) -> Result<(), String> {
    compiled(schema).map(|_| ())
}

/// What is wrong with `arguments` against the tool's `schema`, one line
/// each ("/amount: \"lots\" is not of type \"integer\""); empty when they
/// fit. A schema that does not compile (stored before schemas were
/// checked) checks nothing.
pub fn violations(schema: &Value, arguments: &Value) -> Vec<String> {
    let Ok(validator) = compiled(schema) else {
        return Vec::new();
    };
    validator
        .iter_errors(arguments)
        .take(MOST_REPORTED)
        .map(|error| {
            let at = error.instance_path().to_string();
            let at = if at.is_empty() { "/".to_string() } else { at };
            format!("{at}: {error}")
        })
        .collect()
}

fn compiled(schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
    let key = canonical_json(schema);
    if let Some(validator) = cache().lock().expect("poisoned").get(&key) {
        return Ok(validator.clone());
    }
    let validator = Arc::new(jsonschema::validator_for(schema).map_err(|e| e.to_string())?);
    cache()
        .lock()
        .expect("poisoned")
        .put(key, validator.clone());
    Ok(validator)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_are_checked_against_the_schema() {
        let schema = json!({
            "type": "object",
            "properties": {"amount": {"type": "integer"}, "to": {"type": "string"}},
            "required": ["amount", "to"]
        });
        assert!(violations(&schema, &json!({"amount": 250, "to": "ACME"})).is_empty());
        let found = violations(&schema, &json!({"amount": "lots"}));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found.iter().any(|v| v.starts_with("/amount: ")),
            "{found:?}"
        );
        assert!(found.iter().any(|v| v.contains("\"to\"")), "{found:?}");
        assert!(violations(&json!({}), &json!({"anything": 1})).is_empty());
    }

    #[test]
    fn a_schema_that_is_not_one_is_refused() {
        assert!(check(&json!({"type": "object"})).is_ok());
        assert!(check(&json!({"type": 12})).is_err());
        assert!(check(&json!({"type": "objekt"})).is_err());
        let remote = json!({"$ref": "https://example.com/schema.json"});
        assert!(
            check(&remote).is_err(),
            "a remote reference is never fetched"
        );
    }
}

//! The cross-language test vectors, `tests/vectors/formats.json`: the shard
//! of a run id, and the canonical JSON of a call's arguments with its
//! digest, as the server's own functions compute them. The tests of every
//! SDK read the same file and check their implementations against it.
//!
//! The expected values are never written by hand: after changing an input,
//! `cargo test --test integration vectors::write -- --ignored` fills them in.
//! No server is started here.

use aaa::domain::event::{canonical_json, sha256_hex};
use aaa::domain::{RunId, SHARDS};
use serde_json::{json, Value};

const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/formats.json");

fn read() -> Value {
    let text = std::fs::read_to_string(PATH).expect("tests/vectors/formats.json is readable");
    serde_json::from_str(&text).expect("tests/vectors/formats.json is JSON")
}

/// The file with every expected value computed from its inputs.
fn computed(file: &Value) -> Value {
    let mut out = file.clone();
    out["run_shards"]["shards"] = json!(SHARDS);
    for case in cases(&mut out["run_shards"]) {
        let run_id = case["run_id"].as_str().expect("run_id is a string");
        let id = RunId::parse(run_id).unwrap_or_else(|| panic!("{run_id:?} is a run id"));
        case["shard"] = json!(id.shard());
    }
    for case in cases(&mut out["canonical_json"]) {
        let input = case["input"].as_str().expect("input is a string");
        let value: Value = serde_json::from_str(input)
            .unwrap_or_else(|e| panic!("input {input:?} is not JSON: {e}"));
        case["canonical"] = json!(canonical_json(&value));
        case["sha256"] = json!(sha256_hex(&value));
        case["plain_integers"] = json!(plain_integers(&value));
    }
    out
}

fn cases(section: &mut Value) -> impl Iterator<Item = &mut Value> {
    section["cases"]
        .as_array_mut()
        .expect("a section has cases")
        .iter_mut()
}

/// Every number is an integer in its shortest form: no fraction, exponent or
/// `-0`, which SDKs reading numbers as binary floats would write otherwise.
fn plain_integers(value: &Value) -> bool {
    match value {
        Value::Number(n) => {
            let text = n.to_string();
            text != "-0" && !text.contains(['.', 'e', 'E'])
        }
        Value::Array(items) => items.iter().all(plain_integers),
        Value::Object(map) => map.values().all(plain_integers),
        _ => true,
    }
}

#[test]
fn the_vectors_are_what_the_server_computes() {
    const STALE: &str = "tests/vectors/formats.json is stale: run \
        `cargo test --test integration vectors::write -- --ignored`";
    let file = read();
    let want = computed(&file);
    for section in ["run_shards", "canonical_json"] {
        let cases = file[section]["cases"].as_array().unwrap();
        for (have, want) in cases.iter().zip(want[section]["cases"].as_array().unwrap()) {
            assert_eq!(have, want, "{STALE}");
        }
    }
    assert_eq!(file, want, "{STALE}");
}

#[test]
fn canonical_json_is_a_fixed_point_and_not_a_run_id_has_no_shard() {
    let file = read();
    for case in file["canonical_json"]["cases"].as_array().unwrap() {
        let canonical = case["canonical"].as_str().unwrap();
        let again: Value = serde_json::from_str(canonical).unwrap();
        assert_eq!(canonical_json(&again), canonical, "{}", case["name"]);
    }
    for text in file["run_shards"]["not_run_ids"].as_array().unwrap() {
        let text = text.as_str().unwrap();
        assert!(RunId::parse(text).is_none(), "{text:?} parses as a run id");
        // What the SDKs check instead: the text does not end in two hex digits.
        let last = text.get(text.len().saturating_sub(2)..).unwrap_or("");
        assert!(
            last.len() < 2 || !last.chars().all(|c| c.is_ascii_hexdigit()),
            "{text:?} ends in two hex digits: the SDKs would give it a shard"
        );
    }
}

/// Fills in the expected values: `cargo test --test integration
/// vectors::write -- --ignored`.
#[test]
#[ignore = "writes tests/vectors/formats.json"]
fn write() {
    let text = serde_json::to_string_pretty(&computed(&read())).unwrap();
    std::fs::write(PATH, text + "\n").expect("tests/vectors/formats.json is writable");
}

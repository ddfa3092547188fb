//! The JSON shapes of etcd's gateway: requests are built with `serde_json::json!`, answers are
//! read into these structs. 64-bit numbers travel as strings, keys and values as base64; fields
//! at their default value are left out of answers.

use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};

use crate::gateway::b64;

fn u64_text<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Num {
        Text(String),
        Num(u64),
    }
    match Num::deserialize(d)? {
        Num::Num(n) => Ok(n),
        Num::Text(t) => t.parse().map_err(serde::de::Error::custom),
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Header {
    #[serde(default, deserialize_with = "u64_text")]
    pub revision: u64,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub(crate) struct KeyValue {
    /// Base64.
    #[serde(default)]
    pub key: String,
    /// Base64.
    #[serde(default)]
    pub value: String,
    #[serde(default, deserialize_with = "u64_text")]
    pub mod_revision: u64,
    /// Writes since the key was created: 1 for its first.
    #[serde(default, deserialize_with = "u64_text")]
    pub version: u64,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RangeResponse {
    #[serde(default)]
    pub kvs: Vec<KeyValue>,
    #[serde(default, deserialize_with = "u64_text")]
    pub count: u64,
    #[serde(default)]
    pub more: bool,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct TxnResponse {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub succeeded: bool,
    #[serde(default)]
    pub responses: Vec<ResponseOp>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ResponseOp {
    #[serde(default)]
    pub response_range: Option<RangeResponse>,
    #[serde(default)]
    pub response_txn: Option<TxnResponse>,
}

impl TxnResponse {
    /// The range answer at `index` of this transaction's responses.
    pub(crate) fn range(&self, index: usize) -> Option<&RangeResponse> {
        self.responses.get(index)?.response_range.as_ref()
    }

    /// The nested transaction answer at `index`.
    pub(crate) fn txn(&self, index: usize) -> Option<&TxnResponse> {
        self.responses.get(index)?.response_txn.as_ref()
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct WatchLine {
    #[serde(default)]
    pub result: Option<WatchResponse>,
    #[serde(default)]
    pub error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WatchResponse {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub created: bool,
    #[serde(default)]
    pub canceled: bool,
    #[serde(default, deserialize_with = "u64_text")]
    pub compact_revision: u64,
    #[serde(default)]
    pub events: Vec<Event>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Event {
    /// `PUT` (left out, the default) or `DELETE`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub kv: KeyValue,
}

/// The smallest key above every key that starts with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff: to the end of the key space.
    vec![0]
}

pub(crate) fn txn(compare: Vec<Value>, success: Vec<Value>, failure: Vec<Value>) -> Value {
    json!({ "compare": compare, "success": success, "failure": failure })
}

/// A transaction as an operation of an enclosing transaction.
pub(crate) fn nested(txn: Value) -> Value {
    json!({ "request_txn": txn })
}

/// The key does not exist.
pub(crate) fn absent(key: &[u8]) -> Value {
    json!({ "target": "CREATE", "key": b64(key), "result": "EQUAL", "create_revision": "0" })
}

/// The key was last written at `revision`.
pub(crate) fn modified_at(key: &[u8], revision: u64) -> Value {
    json!({ "target": "MOD", "key": b64(key), "result": "EQUAL", "mod_revision": revision.to_string() })
}

/// The key has been written `version` times since it was created (0: it does not exist).
pub(crate) fn version_is(key: &[u8], version: u64) -> Value {
    json!({ "target": "VERSION", "key": b64(key), "result": "EQUAL", "version": version.to_string() })
}

/// The key's value compares to `value` byte-wise as `result` (`GREATER`, `LESS`, `EQUAL`).
pub(crate) fn value_is(key: &[u8], result: &str, value: &[u8]) -> Value {
    json!({ "target": "VALUE", "key": b64(key), "result": result, "value": b64(value) })
}

pub(crate) fn put(key: &[u8], value: &[u8]) -> Value {
    json!({ "request_put": { "key": b64(key), "value": b64(value) } })
}

pub(crate) fn get(key: &[u8]) -> Value {
    json!({ "request_range": { "key": b64(key) } })
}

/// Every key that starts with `prefix`, as an operation of a transaction.
pub(crate) fn get_prefixed(prefix: &[u8]) -> Value {
    json!({ "request_range": { "key": b64(prefix), "range_end": b64(prefix_end(prefix)) } })
}

pub(crate) fn delete(key: &[u8]) -> Value {
    json!({ "request_delete_range": { "key": b64(key) } })
}

/// Deletes every key from `key` up to (not including) `end`.
pub(crate) fn delete_range(key: &[u8], end: &[u8]) -> Value {
    json!({ "request_delete_range": { "key": b64(key), "range_end": b64(end) } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_above_every_key_with_the_prefix() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(b"a\0"), b"a\x01".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
    }

    #[test]
    fn answers_with_numbers_as_text_and_fields_left_out() {
        let r: TxnResponse = serde_json::from_str(
            r#"{"header":{"revision":"7"},"responses":[{"response_range":{"kvs":[{"key":"YQ==","mod_revision":"5"}],"count":"1"}}]}"#,
        )
        .unwrap();
        assert!(!r.succeeded);
        assert_eq!(r.header.revision, 7);
        let kv = &r.range(0).unwrap().kvs[0];
        assert_eq!((kv.mod_revision, kv.value.as_str()), (5, ""));
    }
}

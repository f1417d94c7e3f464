//! The Chat Completions wire format, as pure functions: a run's
//! conversation and tools as a request body, and an HTTP answer as a model
//! reply, a retry, or a failure. No I/O here; `super` does the HTTP.

use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::domain::event::{canonical_json, ErrorData, OpenAiChoice, ProposedCall, ToolSpec};
use crate::domain::event::{ReplyFacts, Usage};
use crate::engine::state::Message;

/// Longest provider message quoted in an error, in bytes.
const MAX_QUOTED: usize = 300;

/// What one HTTP attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Reply {
        content: String,
        calls: Vec<ProposedCall>,
        facts: ReplyFacts,
    },
    /// Worth another attempt, after `retry_after` when the provider said.
    Retry {
        error: ErrorData,
        retry_after: Option<Duration>,
    },
    /// The model call fails for good.
    Fail(ErrorData),
}

/// The request body: model, messages, tools and the run's settings.
pub fn request_body(choice: &OpenAiChoice, messages: &[Message], tools: &[ToolSpec]) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(choice.model));
    body.insert(
        "messages".into(),
        Value::Array(messages.iter().map(message).collect()),
    );
    if !tools.is_empty() {
        body.insert("tools".into(), tools.iter().map(tool).collect());
    }
    if let Some(t) = choice.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(n) = choice.max_tokens {
        body.insert("max_tokens".into(), json!(n));
    }
    Value::Object(body)
}

fn message(message: &Message) -> Value {
    match message {
        Message::System(text) => json!({"role": "system", "content": text}),
        Message::User(text) => json!({"role": "user", "content": text}),
        Message::Assistant(reply) => {
            let mut out = json!({"role": "assistant", "content": reply.content});
            if !reply.tool_calls.is_empty() {
                // The run's call ids stand for the provider's: the results
                // below answer them.
                let calls: Vec<Value> = reply
                    .tool_calls
                    .iter()
                    .map(|call| {
                        json!({
                            "id": call.call_id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": arguments_text(&call.arguments)},
                        })
                    })
                    .collect();
                out["tool_calls"] = Value::Array(calls);
                if reply.content.is_empty() {
                    out["content"] = Value::Null;
                }
            }
            out
        }
        Message::Tool {
            call_id, content, ..
        } => json!({"role": "tool", "tool_call_id": call_id, "content": content}),
    }
}

/// Arguments as the model wrote them: text it sent that was not JSON is
/// kept as a string, and goes back as it was.
fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::String(text) => text.clone(),
        other => canonical_json(other),
    }
}

fn tool(spec: &ToolSpec) -> Value {
    let parameters = match &spec.parameters {
        Value::Object(map) if !map.is_empty() => spec.parameters.clone(),
        // An empty schema accepts any arguments object.
        _ => json!({"type": "object", "properties": {}}),
    };
    json!({
        "type": "function",
        "function": {"name": spec.name, "description": spec.description, "parameters": parameters},
    })
}

/// What an HTTP answer means. `secret` is cut out of anything quoted.
pub fn outcome(
    status: http::StatusCode,
    retry_after: Option<Duration>,
    body: &[u8],
    secret: Option<&str>,
) -> Outcome {
    if !status.is_success() {
        let message = format!(
            "the provider answered {status}: {}",
            provider_message(body, secret)
        );
        return match status.as_u16() {
            429 => Outcome::Retry {
                error: ErrorData::new("RateLimited", message),
                retry_after,
            },
            500..=599 => Outcome::Retry {
                error: ErrorData::new("ProviderUnavailable", message),
                retry_after,
            },
            _ => Outcome::Fail(ErrorData::new("ProviderRejected", message)),
        };
    }
    match reply(body) {
        Ok(outcome) => outcome,
        Err(why) => Outcome::Retry {
            error: ErrorData::new(
                "MalformedResponse",
                format!("the provider's answer is not a chat completion: {why}"),
            ),
            retry_after: None,
        },
    }
}

/// A 2xx body as a reply (or a typed failure for a cut or filtered one).
fn reply(body: &[u8]) -> Result<Outcome, String> {
    let response: Value = serde_json::from_slice(body).map_err(|e| format!("{e}"))?;
    let choice = response
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first())
        .ok_or("no choices[0]")?;
    let message = choice.get("message").ok_or("no choices[0].message")?;
    let finish_reason = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    match finish_reason.as_str() {
        "length" => {
            return Ok(Outcome::Fail(ErrorData::new(
                "ModelOutputTruncated",
                "the model's reply was cut at its token limit (finish_reason length)",
            )))
        }
        "content_filter" => {
            return Ok(Outcome::Fail(ErrorData::new(
                "ModelContentFiltered",
                "the provider's content filter withheld the reply (finish_reason content_filter)",
            )))
        }
        _ => {}
    }
    let content = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(_) => return Err("choices[0].message.content is not a string".into()),
    };
    let mut calls = Vec::new();
    let tool_calls = match message.get("tool_calls") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(calls)) => calls.as_slice(),
        Some(_) => return Err("choices[0].message.tool_calls is not an array".into()),
    };
    for (i, call) in tool_calls.iter().enumerate() {
        let function = call
            .get("function")
            .ok_or_else(|| format!("tool_calls[{i}] has no function"))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("tool_calls[{i}].function has no name"))?;
        let text = match function.get("arguments") {
            None | Some(Value::Null) => "{}",
            Some(Value::String(text)) => text.as_str(),
            Some(_) => return Err(format!("tool_calls[{i}].function.arguments is not text")),
        };
        // Not JSON: kept as the text it is; the engine answers the model
        // with an InvalidArguments failure instead of asking anyone.
        let arguments = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.into()));
        calls.push(ProposedCall {
            name: name.to_string(),
            arguments,
        });
    }
    let usage = response.get("usage").map(|usage| Usage {
        prompt_tokens: usage
            .get("prompt_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        completion_tokens: usage
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
    });
    Ok(Outcome::Reply {
        content,
        calls,
        facts: ReplyFacts {
            usage,
            model: response
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            finish_reason,
            ..ReplyFacts::default()
        },
    })
}

/// The provider's own words from an error body (`error.message` when it is
/// OpenAI's shape), short, without the key.
pub fn provider_message(body: &[u8], secret: Option<&str>) -> String {
    let text = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("error"))
                .or_else(|| v.get("message"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    redact(&cut(text.trim()), secret)
}

fn cut(text: &str) -> String {
    if text.len() <= MAX_QUOTED {
        return text.to_string();
    }
    let mut end = MAX_QUOTED;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// Removes the key, whole or cut (a provider may quote part of it).
pub fn redact(text: &str, secret: Option<&str>) -> String {
    let Some(secret) = secret.filter(|s| s.len() >= 8) else {
        return text.to_string();
    };
    let mut out = text.replace(secret, "[redacted]");
    // Providers quote keys with the middle starred out: drop any run of 8
    // or more of the key's leading or trailing characters too.
    for piece in [&secret[..8], &secret[secret.len() - 8..]] {
        out = out.replace(piece, "[redacted]");
    }
    out
}

/// `retry-after-ms` (OpenAI's), or `retry-after` in seconds.
pub fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let value: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
        (value.is_finite() && value >= 0.0).then_some(value)
    };
    if let Some(ms) = number("retry-after-ms") {
        return Some(crate::seconds::duration(ms / 1000.0));
    }
    number("retry-after").map(crate::seconds::duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::{AssistantMessage, ToolCallData};

    fn choice() -> OpenAiChoice {
        OpenAiChoice {
            provider: "p".into(),
            model: "m".into(),
            temperature: Some(0.5),
            max_tokens: None,
            max_attempts: 3,
        }
    }

    #[test]
    fn the_conversation_maps_to_chat_messages() {
        let messages = vec![
            Message::System("be brief".into()),
            Message::User("Pay ACME $250".into()),
            Message::Assistant(AssistantMessage {
                content: String::new(),
                tool_calls: vec![
                    ToolCallData {
                        call_id: "call-1".into(),
                        name: "wire_money".into(),
                        arguments: json!({"amount": 250, "to": "ACME"}),
                    },
                    ToolCallData {
                        call_id: "call-2".into(),
                        name: "lookup".into(),
                        arguments: Value::String("{not json".into()),
                    },
                ],
            }),
            Message::Tool {
                call_id: "call-1".into(),
                name: "wire_money".into(),
                content: "sent".into(),
                error: None,
            },
        ];
        let body = request_body(&choice(), &messages, &[]);
        assert_eq!(
            body,
            json!({
                "model": "m",
                "temperature": 0.5,
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "Pay ACME $250"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call-1", "type": "function",
                         "function": {"name": "wire_money", "arguments": "{\"amount\":250,\"to\":\"ACME\"}"}},
                        {"id": "call-2", "type": "function",
                         "function": {"name": "lookup", "arguments": "{not json"}},
                    ]},
                    {"role": "tool", "tool_call_id": "call-1", "content": "sent"},
                ],
            })
        );
    }

    #[test]
    fn answers_become_replies_retries_or_failures() {
        let ok = br#"{"model":"m-1","choices":[{"message":{"content":null,"tool_calls":[
            {"id":"x","type":"function","function":{"name":"t","arguments":"{\"a\":1}"}},
            {"id":"y","type":"function","function":{"name":"t","arguments":"{oops"}}]},
            "finish_reason":"tool_calls"}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#;
        let Outcome::Reply {
            content,
            calls,
            facts,
        } = outcome(http::StatusCode::OK, None, ok, None)
        else {
            panic!("a reply")
        };
        assert_eq!(content, "");
        assert_eq!(calls[0].arguments, json!({"a": 1}));
        assert_eq!(calls[1].arguments, json!("{oops"));
        assert_eq!(facts.usage.unwrap().total(), 15);
        assert_eq!(facts.finish_reason, "tool_calls");

        let cut = br#"{"choices":[{"message":{"content":"abc"},"finish_reason":"length"}]}"#;
        assert!(matches!(
            outcome(http::StatusCode::OK, None, cut, None),
            Outcome::Fail(e) if e.error_type == "ModelOutputTruncated"
        ));
        assert!(matches!(
            outcome(http::StatusCode::OK, None, b"{not json", None),
            Outcome::Retry { error, .. } if error.error_type == "MalformedResponse"
        ));
        let wait = Some(Duration::from_secs(2));
        assert!(matches!(
            outcome(http::StatusCode::TOO_MANY_REQUESTS, wait, b"slow down", None),
            Outcome::Retry { error, retry_after } if error.error_type == "RateLimited" && retry_after == wait
        ));
        let denied = br#"{"error":{"message":"Incorrect API key provided: sk-secret-123456789"}}"#;
        let Outcome::Fail(error) = outcome(
            http::StatusCode::UNAUTHORIZED,
            None,
            denied,
            Some("sk-secret-123456789"),
        ) else {
            panic!("a failure")
        };
        assert_eq!(error.error_type, "ProviderRejected");
        assert!(!error.message.contains("sk-secret"), "{}", error.message);
        assert!(error.message.contains("Incorrect API key provided"));
    }

    #[test]
    fn retry_after_reads_seconds_and_milliseconds() {
        let mut headers = http::HeaderMap::new();
        headers.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(150)));
        headers.clear();
        headers.insert(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }
}

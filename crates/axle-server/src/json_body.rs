//! The JSON body of a request, read so that a refusal names the field at fault: a value of the
//! wrong type or out of range (`max_tokens: -1`), an unknown, missing or duplicate field, each
//! answered 400 with `param` set to the field's path (`messages[0].content`).
use crate::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;

/// A request body of JSON deserialized into `T`.
pub(crate) struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !declares_json(req.headers()) {
            return Err(ApiError::unsupported_media_type());
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large()
            } else {
                ApiError::bad_request(r.body_text(), None)
            }
        })?;
        parse(&bytes).map(JsonBody)
    }
}

/// `application/json`, or a `+json` type, whatever its parameters.
fn declares_json(headers: &axum::http::HeaderMap) -> bool {
    let Some(v) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = v
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Deserializes `bytes`, naming the field at fault on failure. A key given twice anywhere is
/// refused (serde would keep one of them silently where a value is read as a map).
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if let Ok(Duplicate(Some(path))) = serde_json::from_slice::<Duplicate>(bytes) {
        return Err(ApiError::bad_request(
            format!("invalid request body: `{path}` is given twice"),
            Some(&path),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let inner = e.inner();
        let message = format!("invalid request body: {inner}");
        let param = match inner.classify() {
            serde_json::error::Category::Data => {
                let path = field_of(&e.path().to_string(), &inner.to_string());
                // Flattened fields lose their path: find the top-level key without which the
                // body reads.
                path.or_else(|| culprit::<T>(bytes))
            }
            _ => None,
        };
        ApiError::bad_request(message, param.as_deref())
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}"), None))?;
    Ok(value)
}

/// The path of the first key given twice in one object, anywhere in a JSON value (serde keeps
/// one of the two silently where a value is read as a map). Nesting is bounded by serde_json's
/// recursion limit, so the scan's recursion is too.
struct Duplicate(Option<String>);

impl<'de> serde::Deserialize<'de> for Duplicate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Scan;
        impl<'de> serde::de::Visitor<'de> for Scan {
            type Value = Duplicate;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Duplicate, A::Error> {
                let mut seen = std::collections::HashSet::new();
                let mut found = None;
                while let Some(k) = m.next_key::<String>()? {
                    let inner = m.next_value::<Duplicate>()?;
                    if found.is_none() {
                        found = if !seen.insert(k.clone()) {
                            Some(k)
                        } else {
                            inner.0.map(|p| join(&k, &p))
                        };
                    }
                }
                Ok(Duplicate(found))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut s: A,
            ) -> Result<Duplicate, A::Error> {
                let mut found = None;
                let mut i = 0usize;
                while let Some(inner) = s.next_element::<Duplicate>()? {
                    if found.is_none() {
                        found = inner.0.map(|p| join(&format!("[{i}]"), &p));
                    }
                    i += 1;
                }
                Ok(Duplicate(found))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Duplicate, E> {
                Ok(Duplicate(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Duplicate, E> {
                Ok(Duplicate(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Duplicate, E> {
                Ok(Duplicate(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Duplicate, E> {
                Ok(Duplicate(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Duplicate, E> {
                Ok(Duplicate(None))
            }
            fn visit_unit<E>(self) -> Result<Duplicate, E> {
                Ok(Duplicate(None))
            }
        }
        d.deserialize_any(Scan)
    }
}

/// `outer` then `inner` as a field path (`a.b`, `a[0]`).
fn join(outer: &str, inner: &str) -> String {
    if inner.starts_with('[') {
        format!("{outer}{inner}")
    } else {
        format!("{outer}.{inner}")
    }
}

/// The top-level key at fault in a body that does not read as `T`: the one whose removal makes
/// it read (an optional field; required ones carry their path). Tried on bodies of at most
/// 64 KiB and 64 keys (an error path; each try reads the body again).
fn culprit<T: DeserializeOwned>(bytes: &[u8]) -> Option<String> {
    if bytes.len() > 64 << 10 {
        return None;
    }
    let serde_json::Value::Object(map) = serde_json::from_slice(bytes).ok()? else {
        return None;
    };
    if map.len() > 64 {
        return None;
    }
    map.keys().find_map(|k| {
        let mut without = map.clone();
        without.remove(k);
        serde_json::from_value::<T>(serde_json::Value::Object(without))
            .ok()
            .map(|_| k.clone())
    })
}

/// The field a data error is about: its path, extended by the field an unknown, missing or
/// duplicate field error names (those are raised by the object that holds the field).
fn field_of(path: &str, message: &str) -> Option<String> {
    let path = if path == "." { "" } else { path };
    let named = ["unknown field `", "missing field `", "duplicate field `"]
        .iter()
        .find_map(|p| message.split_once(p))
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(name, _)| name);
    match (path, named) {
        ("", None) => None,
        ("", Some(n)) => Some(n.to_string()),
        (p, None) => Some(p.to_string()),
        (p, Some(n)) if p == n || p.ends_with(&format!(".{n}")) => Some(p.to_string()),
        (p, Some(n)) => Some(format!("{p}.{n}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Req {
        max_tokens: Option<usize>,
        seed: Option<u64>,
        messages: Option<Vec<Msg>>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Msg {
        role: String,
    }

    fn param_of(body: &str) -> Option<String> {
        parse::<Req>(body.as_bytes()).expect_err(body).param
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Flat {
        prompt: String,
        #[serde(flatten)]
        req: Req,
    }

    #[test]
    fn flattened_fields_and_duplicates_are_named_too() {
        let e = parse::<Flat>(br#"{"prompt": "x", "max_tokens": -1}"#).expect_err("negative");
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{}", e.message);
        // Not only when the field comes last.
        let e =
            parse::<Flat>(br#"{"max_tokens": -1, "prompt": "x", "seed": 3}"#).expect_err("first");
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{}", e.message);
        let e = parse::<Flat>(
            br#"{"prompt": "x",
            "seed": 1, "seed": 2}"#,
        )
        .expect_err("twice");
        assert_eq!(e.param.as_deref(), Some("seed"), "{}", e.message);
        let e = parse::<Flat>(
            br#"{"prompt": "x", "messages": [{"role": "a"}, {"role": "b", "role": "c"}]}"#,
        )
        .expect_err("nested twice");
        assert_eq!(
            e.param.as_deref(),
            Some("messages[1].role"),
            "{}",
            e.message
        );
        let e = parse::<Flat>(br#"{"prompt": "x", "f": {"type": "a", "g": {"h": 1, "h": 2}}}"#)
            .expect_err("deep twice");
        assert_eq!(e.param.as_deref(), Some("f.g.h"), "{}", e.message);
    }

    #[test]
    fn refusals_name_the_field() {
        assert_eq!(
            param_of(r#"{"max_tokens": -1}"#).as_deref(),
            Some("max_tokens")
        );
        assert_eq!(param_of(r#"{"seed": -5}"#).as_deref(), Some("seed"));
        assert_eq!(
            param_of(r#"{"max_tokens": 1, "max_tokens": 2}"#).as_deref(),
            Some("max_tokens")
        );
        assert_eq!(param_of(r#"{"nope": 1}"#).as_deref(), Some("nope"));
        assert_eq!(
            param_of(r#"{"messages": [{"role": 3}]}"#).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            param_of(r#"{"messages": [{}]}"#).as_deref(),
            Some("messages[0].role")
        );
        // Malformed JSON has no field.
        assert_eq!(param_of(r#"{"max_tokens": "#), None);
        assert_eq!(param_of(r#"{} {}"#), None);
        assert!(parse::<Req>(br#"{"max_tokens": 3}"#).is_ok());
    }
}

//! The one error type of the HTTP surface, rendered in OpenAI's JSON error shape with the right
//! status code; SDK errors and rejections map onto it here, and only here.
use crate::openai::{ErrorBody, ErrorDetail, WireError};
use axle_sdk::{DelegateError, Field, Rejection, SdkError};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An API error.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI error type.
    pub kind: &'static str,
    /// Offending parameter, if any.
    pub param: Option<String>,
    /// Machine-readable code, if any.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 invalid_request_error.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// 413 for a body over [`crate::MAX_BODY`].
    pub fn too_large() -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::bad_request(
                format!("request body too large (limit {} bytes)", crate::MAX_BODY),
                None,
            )
        }
    }

    /// 415 for a body not declared as JSON.
    pub fn unsupported_media_type() -> ApiError {
        ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: Some("unsupported_media_type"),
            ..ApiError::bad_request(
                "expected a JSON body with `Content-Type: application/json`",
                None,
            )
        }
    }

    /// 408 for a request whose body did not arrive within the body timeout (or, while every
    /// connection slot was taken, arrived too slowly).
    pub fn body_timeout(limit: std::time::Duration) -> ApiError {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            code: Some("body_timeout"),
            ..ApiError::bad_request(
                format!(
                    "the request body did not arrive within {:.1} s (or arrived too slowly while the server was full)",
                    limit.as_secs_f64()
                ),
                None,
            )
        }
    }

    /// 404 for an unknown model.
    pub fn unknown_model(name: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{name}` does not exist"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 404 for a path no route serves.
    pub fn not_found(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some("not_found"),
            ..ApiError::bad_request(format!("no route for {path}"), None)
        }
    }

    /// 405 for a route asked with a method it does not take.
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            code: Some("method_not_allowed"),
            ..ApiError::bad_request(format!("{path} does not take {method}"), None)
        }
    }

    /// 401 for a missing or wrong key.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 503 when the queue is full.
    pub fn overloaded(depth: usize) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!("the server is busy ({depth} requests queued); retry later"),
            kind: "server_error",
            param: None,
            code: Some("queue_full"),
        }
    }

    /// 503 for a connection over the server's cap.
    pub fn too_many_connections(cap: usize) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!("the server has {cap} connections open, its limit; retry later"),
            kind: "server_error",
            param: None,
            code: Some("too_many_connections"),
        }
    }

    /// 500 for failures inside the engine.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind.to_string(),
                param: self.param.clone(),
                code: self.code.map(str::to_string),
            },
        }
    }

    /// A refused request: 400, with the field named as the route's wire shape names it
    /// (`param`: the SDK's field to the wire's name; the prompt is `messages`, `prompt` or
    /// `tokens` there).
    pub fn rejected(r: &Rejection, param: impl Fn(Field) -> &'static str) -> ApiError {
        let param = param(r.field());
        ApiError {
            code: match r {
                Rejection::ContextOverflow { .. } => Some("context_length_exceeded"),
                Rejection::Unsupported { .. } => Some("unsupported_parameter"),
                Rejection::Invalid { .. } => Some("invalid_value"),
            },
            ..ApiError::bad_request(format!("{param}: {}", r.reason()), Some(param))
        }
    }

    /// A body that does not map onto a request.
    pub fn wire(e: WireError, param: impl Fn(Field) -> &'static str) -> ApiError {
        match e {
            WireError::Rejected(r) => ApiError::rejected(&r, param),
            WireError::Unsupported { field, reason } => ApiError {
                code: Some("unsupported_parameter"),
                ..ApiError::bad_request(format!("{field}: {reason}"), Some(field))
            },
            WireError::Unknown(name) => ApiError {
                code: Some("unknown_parameter"),
                ..ApiError::bad_request(
                    format!(
                        "{name}: unrecognized request argument (this server does not support it)"
                    ),
                    Some(&name),
                )
            },
        }
    }

    /// Any SDK error, `param` naming the route's fields.
    pub fn sdk(e: SdkError, param: impl Fn(Field) -> &'static str) -> ApiError {
        match e {
            SdkError::Rejected(r) => ApiError::rejected(&r, param),
            SdkError::Upstream(u) => ApiError::upstream(u),
            e @ (SdkError::Model(_)
            | SdkError::Config(_)
            | SdkError::Generation(_)
            | SdkError::Route(_)
            | SdkError::EngineStopped) => ApiError::internal(e.to_string()),
        }
    }

    /// An upstream failure: 502 unreachable or failed, 504 timeout, the upstream's own 4xx
    /// passed on (a refused key is our configuration's fault, so 502).
    pub fn upstream(e: DelegateError) -> ApiError {
        let (status, code) = match &e {
            DelegateError::Unreachable { .. } => (StatusCode::BAD_GATEWAY, "upstream_unreachable"),
            DelegateError::Timeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout"),
            DelegateError::Rejected { status, .. } if *status == 401 || *status == 403 => {
                (StatusCode::BAD_GATEWAY, "upstream_auth")
            }
            DelegateError::Rejected { status, .. } => (
                StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_REQUEST),
                "upstream_rejected",
            ),
            DelegateError::Failed { .. } | DelegateError::Protocol { .. } => {
                (StatusCode::BAD_GATEWAY, "upstream_error")
            }
        };
        let client_fault = status.is_client_error();
        ApiError {
            status,
            message: e.to_string(),
            kind: if client_fault {
                "invalid_request_error"
            } else {
                "server_error"
            },
            param: None,
            code: Some(code),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

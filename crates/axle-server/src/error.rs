//! The one error type of the HTTP surface, rendered in OpenAI's JSON error shape with the right
//! status code.
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
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(r: axum::extract::rejection::JsonRejection) -> ApiError {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::too_large();
        }
        ApiError::bad_request(r.body_text(), None)
    }
}

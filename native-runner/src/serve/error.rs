//! OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>, code: Option<&'static str>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code,
        }
    }

    pub fn not_found(message: impl Into<String>, param: Option<&str>, code: &'static str) -> Self {
        ApiError {
            status: 404,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: Some(code),
        }
    }

    pub fn unauthorized() -> Self {
        ApiError {
            status: 401,
            message: "Incorrect or missing API key (send `Authorization: Bearer KEY`).".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    pub fn queue_full(capacity: usize) -> Self {
        ApiError {
            status: 429,
            message: format!("The server is busy: {capacity} requests are already waiting. Retry later."),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
        }
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        ApiError {
            status: 405,
            message: format!("{method} is not allowed on {path}"),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// The device failed (lost, out of memory): 503, so that a client retries elsewhere or later.
    pub fn unavailable(message: impl Into<String>, code: &'static str) -> Self {
        ApiError { status: 503, message: message.into(), kind: "server_error", param: None, code: Some(code) }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError { status: 500, message: message.into(), kind: "server_error", param: None, code: None }
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

//! Request bodies of `/v1/chat/completions` and `/v1/completions`: the core's one request schema
//! ([`hearth_core::request`]), whose refusals become 400s naming the parameter.

use super::error::ApiError;
use hearth_core::request::{Request, ValidRequest};
use hearth_core::CoreError;

pub use hearth_core::request::Endpoint;

pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<ValidRequest, ApiError> {
    let request =
        Request::from_json(body).and_then(|r| r.validate(endpoint, clock_seed())).map_err(|e| request_error(&e))?;
    if request.generation.speculative.is_some() {
        return Err(ApiError::bad_request(
            "speculative is not a per-request option of hearth serve: start the server with --lookup or --draft-model (speculative decoding for every request), or send a prediction.",
            Some("speculative"),
            None,
        ));
    }
    Ok(request)
}

/// A refusal of the request schema as a 400 naming its parameter.
pub fn request_error(error: &CoreError) -> ApiError {
    match error {
        CoreError::BadRequest { param, message } => ApiError::bad_request(message.clone(), param.as_deref(), None),
        other => ApiError::bad_request(other.to_string(), None, None),
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

//! Runs the async step API synchronously. Natively every backend finishes a step inside
//! `submit`/`ready` (the wgpu backend waits on the device there), so the futures of
//! [`crate::runner::Runner::step_async`] and friends are ready at their first poll; the sync API
//! is that one poll. A future that is still pending is a backend that needs an event loop (WebGPU
//! in a browser): that is an error, never a hang.

use crate::error::{CoreError, Result};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Polls `future` once with a no-op waker; `Err` if it is not ready.
pub fn block_on<T>(future: impl Future<Output = Result<T>>) -> Result<T> {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => result,
        Poll::Pending => Err(CoreError::Backend {
            backend: "sync".into(),
            message: "the backend finishes steps asynchronously (WebGPU in a browser); use the async API (step_async, eval_async, generate_async)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_future_returns_its_value_and_pending_one_is_an_error() {
        assert_eq!(block_on(async { Ok(7) }).unwrap(), 7);
        let pending = std::future::pending::<Result<()>>();
        assert!(matches!(block_on(pending), Err(CoreError::Backend { .. })));
    }
}

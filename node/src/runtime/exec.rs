//! Runs TensorFlow work off the async runtime. TF_SessionRun and friends block,
//! so they never run on a tokio worker thread.

use crate::error::{Error, Result};

/// Runs `work` on the blocking thread pool and waits for it without blocking the
/// runtime. A panic inside `work` becomes an internal error for this request only.
pub async fn blocking<T, F>(work: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(join) => {
            tracing::error!(cause = %join, "TensorFlow work panicked");
            Err(Error::Internal(format!("TensorFlow work failed: {join}")))
        }
    }
}

/// Drops `value` on the blocking thread pool: the last reference to a job
/// closes its TensorFlow session or context, which must not happen on a tokio
/// worker thread. Fails only if the drop panicked.
pub async fn drop_off_runtime<T: Send + 'static>(value: T) -> Result<()> {
    blocking(move || {
        drop(value);
        Ok(())
    })
    .await
}

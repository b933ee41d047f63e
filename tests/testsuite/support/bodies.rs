//! Bodies the guard's tests race.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::Rejected;

/// A body that counts its runs in `runs`, stays in flight long enough for
/// every racer to arrive, and returns `value`.
pub(crate) fn counted(
    runs: &Arc<AtomicUsize>,
    value: &str,
) -> impl Future<Output = Result<String, Rejected>> + Send + 'static {
    let (runs, value) = (Arc::clone(runs), value.to_owned());
    async move {
        runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(value)
    }
}

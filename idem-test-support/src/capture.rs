//! What `tracing` printed, for tests that assert on the gate's log lines.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Everything `tracing` printed in this test binary, from the first call of
/// [`Captured::global`] on. Global rather than scoped to one test: scoped
/// subscribers miss events whose callsites other tests' threads registered
/// first. Tests tell their lines apart by their gate's unique account.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// The capture, installed as the global subscriber on first use.
    ///
    /// # Panics
    /// When another global subscriber was installed first.
    pub fn global() -> &'static Captured {
        static CAPTURED: OnceLock<Captured> = OnceLock::new();
        CAPTURED.get_or_init(|| {
            let captured = Captured::default();
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter("idem=trace")
                .with_ansi(false)
                .with_writer(captured.clone())
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in this test binary");
            captured
        })
    }

    /// A capture of what `tracing` prints at INFO and above on this thread,
    /// without colour codes, for as long as the guard lives.
    pub fn scoped() -> (Captured, tracing::subscriber::DefaultGuard) {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (
            captured.clone(),
            tracing::subscriber::set_default(subscriber),
        )
    }

    /// Everything captured, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }

    /// The captured lines that mention `needle`.
    pub fn lines_with(&self, needle: &str) -> String {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|line| line.contains(needle))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

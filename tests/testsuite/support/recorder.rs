//! The process's metrics recorder. A process has one global recorder, and
//! every module of this one binary that reads metrics (`metrics`,
//! `by_hand::documented_promises`) shares it: a second `set_global_recorder` fails.

use std::sync::{Arc, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};

/// A recorder whose values can be read at any time, by any test, without
/// resetting them (the `metrics-util` debugging recorder drains on read).
pub(crate) struct Readable {
    pub(crate) registry: Registry<Key, AtomicStorage>,
}

impl Recorder for Readable {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.registry
            .get_or_create_counter(key, |counter| Counter::from_arc(Arc::clone(counter)))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.registry
            .get_or_create_gauge(key, |gauge| Gauge::from_arc(Arc::clone(gauge)))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.registry
            .get_or_create_histogram(key, |histogram| Histogram::from_arc(Arc::clone(histogram)))
    }
}

/// The process's recorder, installed by the first test that asks.
pub(crate) fn recorder() -> &'static Readable {
    static RECORDER: OnceLock<&'static Readable> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder: &'static Readable = Box::leak(Box::new(Readable {
            registry: Registry::atomic(),
        }));
        metrics::set_global_recorder(recorder)
            .expect("no other recorder is installed in this test binary");
        idem::metrics::describe();
        recorder
    })
}

//! idem's schema: set-up and start-up verification, least privilege, the
//! partitioned layout, and a rolling deploy beside the previous release.

mod partitioned;
mod previous_release;
mod privileges;
mod setup;
// It reads the open claims through the gauges and the console too.
#[cfg(all(feature = "metrics", feature = "console"))]
mod v9_redteam;

//! idem's schema: set-up and start-up verification, least privilege, the
//! partitioned layout, and a rolling deploy beside the previous release.

mod partitioned;
mod previous_release;
mod privileges;
mod setup;

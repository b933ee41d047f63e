//! idem on Citus (ignored: `scripts/test-citus` starts a cluster and runs
//! them): the coordinator's races and set-up, and a worker stopped
//! mid-race on a cluster of its own.

mod cluster;
mod faults;

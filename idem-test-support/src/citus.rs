//! A Citus cluster of our own: a coordinator and N workers, each a
//! [`Cluster`] with `shared_preload_libraries=citus` in a directory of one
//! parent (`coordinator`, `worker-1`, `worker-2`, ...), on free ports, the
//! workers added to the coordinator. Tests reach it through the coordinator
//! only ([`CitusCluster::url`]); a fault test stops and starts a worker
//! ([`CitusCluster::stop_worker`]).
//!
//! Citus must be installed for the machine's PostgreSQL:
//! `scripts/citus-install` does it. `pg-cluster citus start` (and
//! `scripts/test-citus`) leave one running ([`CitusCluster::keep_running`]).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use idem::sqlx::{self, Connection, PgConnection};

use crate::binaries::Binaries;
use crate::cluster::{self, Cluster, ClusterError, Setup};

/// The coordinator's `max_connections`: the whole suite runs in parallel
/// against it, many tests with pools of their own.
const COORDINATOR_CONNECTIONS: u32 = 300;

/// A worker's `max_connections`: the coordinator's connections to it
/// ([`SHARED_POOL_SIZE`]) and headroom for Citus's own (the maintenance
/// daemon, metadata syncing, recovery of prepared transactions).
const WORKER_CONNECTIONS: u32 = 400;

/// `citus.max_shared_pool_size` on the coordinator: the connections all of
/// its sessions together may hold to one worker. Below the workers'
/// `max_connections`, so a busy coordinator queues for a connection instead
/// of being refused by a worker ("too many clients already").
const SHARED_POOL_SIZE: u32 = 300;

/// Settings every node gets.
const NODE_SETTINGS: &[(&str, &str)] = &[
    ("shared_preload_libraries", "citus"),
    // Citus built with libcurl reports usage to Citus Data daily: not from
    // a test run.
    ("citus.enable_statistics_collection", "off"),
];

/// The coordinator's directory in the cluster's.
const COORDINATOR: &str = "coordinator";

/// Why a Citus cluster could not be started or set up.
#[derive(Debug, thiserror::Error)]
pub enum CitusError {
    /// No server binaries, or a node could not be created or started.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The server binaries have no Citus beside them.
    #[error(
        "Citus is not installed for the PostgreSQL in {} ({} is missing): run scripts/citus-install \
         (it says where to get the source)",
        .binaries.display(), .library.display()
    )]
    NotInstalled {
        /// The server binaries' directory.
        binaries: PathBuf,
        /// The library that is missing.
        library: PathBuf,
    },
    /// A statement setting a node up failed.
    #[error("setting up Citus on {node} ({url}): {source}")]
    Setup {
        /// Which node: `coordinator`, `worker-1`, ...
        node: String,
        /// Its URL.
        url: String,
        /// What PostgreSQL said.
        #[source]
        source: sqlx::Error,
    },
    /// The set-up thread could not be run.
    #[error("setting up Citus: {0}")]
    Io(#[from] std::io::Error),
    /// There is no worker of that number.
    #[error("no worker {index}: the cluster has {workers}")]
    NoWorker {
        /// The number asked for.
        index: usize,
        /// How many there are.
        workers: usize,
    },
}

/// A running Citus cluster. Dropped, every node is stopped and its
/// directory removed, unless [`CitusCluster::keep_running`] let it go.
#[derive(Debug)]
pub struct CitusCluster {
    dir: PathBuf,
    coordinator: Option<Cluster>,
    workers: Vec<Cluster>,
}

impl CitusCluster {
    /// A coordinator and `workers` workers of the machine's PostgreSQL in
    /// `dir` (created if need be; the nodes' directories in it are
    /// emptied first), started, Citus created on each and the workers
    /// added to the coordinator. Blocking: call it from `spawn_blocking` in
    /// async code.
    pub fn start(dir: impl Into<PathBuf>, workers: usize) -> Result<CitusCluster, CitusError> {
        let binaries = Binaries::local().map_err(ClusterError::from)?;
        CitusCluster::start_with(binaries, dir.into(), workers)
    }

    /// As [`CitusCluster::start`], with these binaries.
    pub fn start_with(
        binaries: Binaries,
        dir: PathBuf,
        workers: usize,
    ) -> Result<CitusCluster, CitusError> {
        if let Some(lib) = binaries.pkglibdir() {
            let library = lib.join("citus.so");
            if !library.is_file() {
                return Err(CitusError::NotInstalled {
                    binaries: binaries.dir().to_owned(),
                    library,
                });
            }
        }
        // A node's data directory would be reused, with the ports of its
        // last run in Citus's metadata: start afresh.
        stop(&binaries, &dir);
        for node in node_dirs(&dir) {
            fs::remove_dir_all(&node).map_err(|source| ClusterError::Io {
                what: format!("remove the last run's {}", node.display()),
                source,
            })?;
        }
        fs::create_dir_all(&dir).map_err(|source| ClusterError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        let ports = free_ports(workers + 1)?;
        // From here on, dropping `citus` stops whatever was started.
        let mut citus = CitusCluster {
            dir: dir.clone(),
            coordinator: None,
            workers: Vec::with_capacity(workers),
        };
        let shared_pool = SHARED_POOL_SIZE.to_string();
        citus.coordinator = Some(
            node(
                &binaries,
                dir.join(COORDINATOR),
                ports[0],
                COORDINATOR_CONNECTIONS,
                &[("citus.max_shared_pool_size", &shared_pool)],
            )
            .start()?,
        );
        for (index, port) in ports[1..].iter().enumerate() {
            let worker = node(
                &binaries,
                dir.join(worker_name(index)),
                *port,
                WORKER_CONNECTIONS,
                &[],
            );
            citus.workers.push(worker.start()?);
        }
        let coordinator = citus.url();
        let workers = citus.worker_urls();
        on_its_own_runtime(async {
            create_extension(COORDINATOR, &coordinator).await?;
            for (index, url) in workers.iter().enumerate() {
                create_extension(&worker_name(index), url).await?;
            }
            add_nodes(&coordinator, ports[0], &ports[1..]).await
        })?;
        Ok(citus)
    }

    /// The coordinator's URL: what the tests connect to.
    pub fn url(&self) -> String {
        self.coordinator
            .as_ref()
            .map(Cluster::url)
            .unwrap_or_default()
    }

    /// The workers' URLs, in order.
    pub fn worker_urls(&self) -> Vec<String> {
        self.workers.iter().map(Cluster::url).collect()
    }

    /// Stops worker `index` (0-based) at once, as a crash would (`pg_ctl
    /// stop -m immediate`); statements needing its shards then fail until
    /// [`CitusCluster::start_worker`]. Blocking.
    pub fn stop_worker(&self, index: usize) -> Result<(), CitusError> {
        Ok(self.worker(index)?.stop_immediately()?)
    }

    /// Starts worker `index` (0-based) again. Blocking.
    pub fn start_worker(&self, index: usize) -> Result<(), CitusError> {
        Ok(self.worker(index)?.start_again()?)
    }

    /// Lets every node run on after this process is gone; the coordinator's
    /// URL. Stop them with [`stop`].
    pub fn keep_running(mut self) -> String {
        let url = self.url();
        if let Some(coordinator) = self.coordinator.take() {
            coordinator.keep_running();
        }
        for worker in self.workers.drain(..) {
            worker.keep_running();
        }
        url
    }

    fn worker(&self, index: usize) -> Result<&Cluster, CitusError> {
        self.workers.get(index).ok_or(CitusError::NoWorker {
            index,
            workers: self.workers.len(),
        })
    }
}

impl Drop for CitusCluster {
    fn drop(&mut self) {
        let kept = self.coordinator.is_none() && self.workers.is_empty();
        // Each node stops and removes its own directory as it is dropped.
        self.coordinator = None;
        self.workers.clear();
        if !kept {
            // Only when empty: it may hold the caller's files too.
            let _ = fs::remove_dir(&self.dir);
        }
    }
}

/// Stops every node of the Citus cluster in `dir` at once, if any runs
/// there; their directories stay. Blocking.
pub fn stop(binaries: &Binaries, dir: &Path) {
    for node in node_dirs(dir) {
        cluster::stop(binaries, &node);
    }
}

/// `true` when the server at `url` is a Citus coordinator: the extension is
/// created in its database and it is the coordinator of its cluster.
pub async fn is_coordinator(url: &str) -> Result<bool, sqlx::Error> {
    let mut connection = PgConnection::connect(url).await?;
    let created: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")
            .fetch_one(&mut connection)
            .await?;
    let coordinator = if created {
        sqlx::query_scalar("SELECT citus_is_coordinator()")
            .fetch_one(&mut connection)
            .await?
    } else {
        false
    };
    let _ = connection.close().await;
    Ok(coordinator)
}

/// A node's set-up: fsync off (nothing outlives the run), Citus preloaded.
fn node(
    binaries: &Binaries,
    dir: PathBuf,
    port: u16,
    max_connections: u32,
    extra: &[(&str, &str)],
) -> Setup {
    Setup {
        binaries: binaries.clone(),
        dir,
        port,
        max_connections,
        fsync: false,
        settings: NODE_SETTINGS
            .iter()
            .chain(extra)
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect(),
    }
}

/// `worker-1` for index 0: the directory and the name in messages.
fn worker_name(index: usize) -> String {
    format!("worker-{}", index + 1)
}

/// The nodes' directories in `dir`: the coordinator's and every
/// `worker-N`'s that exists.
fn node_dirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name == COORDINATOR || name.starts_with("worker-")
        })
        .map(|entry| entry.path())
        .collect()
}

/// `count` distinct free ports: the OS may hand the same one out twice when
/// each listener is closed before the next is asked for.
fn free_ports(count: usize) -> Result<Vec<u16>, ClusterError> {
    let mut ports = BTreeSet::new();
    let mut ordered = Vec::with_capacity(count);
    while ordered.len() < count {
        let port = cluster::free_port()?;
        if ports.insert(port) {
            ordered.push(port);
        }
    }
    Ok(ordered)
}

/// Runs `work` to completion on a runtime of its own, on a thread of its
/// own: the caller may be in async code's `spawn_blocking`, or have no
/// runtime at all.
fn on_its_own_runtime(
    work: impl Future<Output = Result<(), CitusError>> + Send,
) -> Result<(), CitusError> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(work)
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Creates the extension on a node.
async fn create_extension(node: &str, url: &str) -> Result<(), CitusError> {
    let failed = setup_failed(node, url);
    let mut connection = PgConnection::connect(url).await.map_err(failed)?;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS citus")
        .execute(&mut connection)
        .await
        .map_err(setup_failed(node, url))?;
    let _ = connection.close().await;
    Ok(())
}

/// Tells the coordinator at `url` where it is (`port`) and adds the
/// workers listening on `workers`.
async fn add_nodes(url: &str, port: u16, workers: &[u16]) -> Result<(), CitusError> {
    let failed = || setup_failed(COORDINATOR, url);
    let mut connection = PgConnection::connect(url).await.map_err(failed())?;
    sqlx::query("SELECT citus_set_coordinator_host('127.0.0.1', $1)")
        .bind(i32::from(port))
        .execute(&mut connection)
        .await
        .map_err(failed())?;
    for worker in workers {
        sqlx::query("SELECT citus_add_node('127.0.0.1', $1)")
            .bind(i32::from(*worker))
            .execute(&mut connection)
            .await
            .map_err(failed())?;
    }
    let _ = connection.close().await;
    Ok(())
}

/// The error of a failed set-up statement on `node`.
fn setup_failed<'a>(node: &'a str, url: &'a str) -> impl FnOnce(sqlx::Error) -> CitusError + 'a {
    move |source| CitusError::Setup {
        node: node.to_owned(),
        url: url.to_owned(),
        source,
    }
}

/// `host:port` of the worker holding `account`'s shard of `idem_records`,
/// asked of the coordinator `pool` connects to: for a test that needs
/// accounts on a given worker.
pub async fn worker_of(pool: &sqlx::PgPool, account: &str) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT nodename || ':' || nodeport FROM citus_shards \
         WHERE table_name = 'idem_records'::regclass \
           AND shardid = get_shard_id_for_distribution_column('idem_records', $1)",
    )
    .bind(account)
    .fetch_one(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_citus_installed_it_says_to_install_it() {
        use std::os::unix::fs::PermissionsExt;

        // Binaries whose pg_config names a library directory with no Citus.
        let bin = std::env::temp_dir().join(idem::testing::unique_name("idem-no-citus"));
        fs::create_dir_all(&bin).expect("create the binaries' directory");
        let pg_config = bin.join("pg_config");
        fs::write(&pg_config, format!("#!/bin/sh\necho {}\n", bin.display()))
            .expect("write pg_config");
        fs::set_permissions(&pg_config, fs::Permissions::from_mode(0o755))
            .expect("make pg_config executable");
        let binaries = Binaries::in_dir(bin.clone()).expect("binaries");
        let started = CitusCluster::start_with(binaries, bin.join("cluster"), 2);
        fs::remove_dir_all(&bin).expect("remove the binaries' directory");
        let error = started.expect_err("no Citus, no cluster").to_string();
        assert!(
            error.contains("citus.so is missing") && error.contains("scripts/citus-install"),
            "{error}"
        );
    }

    #[test]
    #[ignore = "needs Citus: scripts/citus-install"]
    fn a_coordinator_with_two_active_workers() {
        let dir = std::env::temp_dir().join(idem::testing::unique_name("idem-citus-test"));
        let citus = CitusCluster::start(&dir, 2).expect("start a Citus cluster");
        let url = citus.url();
        let (workers, coordinator) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(async {
                let mut connection = PgConnection::connect(&url).await.expect("connect");
                let workers: Vec<(String, i64)> =
                    sqlx::query_as("SELECT * FROM citus_get_active_worker_nodes() ORDER BY 2")
                        .fetch_all(&mut connection)
                        .await
                        .expect("list the workers");
                (workers, is_coordinator(&url).await.expect("ask"))
            });
        let mut expected: Vec<(String, i64)> = citus
            .workers
            .iter()
            .map(|worker| ("127.0.0.1".to_owned(), i64::from(worker.port())))
            .collect();
        expected.sort_by_key(|(_, port)| *port);
        assert_eq!(workers, expected);
        assert!(coordinator, "the coordinator says it is one");

        // A worker stopped refuses connections until started again.
        let worker = &citus.worker_urls()[0];
        citus.stop_worker(0).expect("stop worker 1");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        assert!(runtime.block_on(PgConnection::connect(worker)).is_err());
        citus.start_worker(0).expect("start worker 1");
        assert!(
            !runtime
                .block_on(is_coordinator(worker))
                .expect("worker 1 answers again"),
            "a worker is no coordinator"
        );
        assert!(matches!(
            citus.stop_worker(2),
            Err(CitusError::NoWorker {
                index: 2,
                workers: 2
            })
        ));
        drop(citus);
        assert!(!dir.exists(), "dropped, the cluster leaves nothing behind");
    }
}

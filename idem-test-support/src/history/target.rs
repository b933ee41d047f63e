//! Where a run happens: the gate, its store (the test database or a
//! throwaway cluster, straight or through a fault proxy), and what can be
//! done to it.

use std::sync::Arc;
use std::time::Duration;

use idem::sqlx::PgPool;
use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem::{Gate, testing};

use super::body::create_effects_table;
use crate::cluster::Cluster;
use crate::fault_proxy::Proxy;

/// Where a run happens: the gate, and what can be done to its store.
#[derive(Clone)]
pub struct Target {
    /// The gate every invocation goes through.
    pub gate: Gate,
    /// Straight to the server: kills the gate's backends, reads the final
    /// rows.
    pub admin: PgPool,
    /// The gate's connections carry it, so that they can be killed.
    pub application_name: String,
    /// The fault proxy in front of the server, when the gate goes through one.
    pub proxy: Option<Arc<Proxy>>,
    /// The run's own cluster, when it may be restarted and crashed.
    pub cluster: Option<Arc<Cluster>>,
    /// A gate beside `gate`, in its account: a copy with an outcome cache
    /// (`Gate::with_cache`, feature `cache`), or another process's gate
    /// ([`Target::elsewhere`]). The workload's `cached` share of calls go
    /// through it.
    pub cached: Option<Gate>,
}

impl Target {
    /// The test database, the gate's pool straight to it.
    pub async fn direct(connections: u32) -> Target {
        let application_name = testing::unique_name("history");
        let options = database_options().application_name(&application_name);
        Target::on(
            options,
            database_options(),
            application_name,
            None,
            None,
            connections,
        )
        .await
    }

    /// The test database, the gate's pool through a fault proxy.
    pub async fn proxied(connections: u32) -> Target {
        let proxy = Arc::new(Proxy::start().await);
        Target::through(proxy, database_options(), None, connections).await
    }

    /// A throwaway cluster of the run's own, which can be restarted and
    /// crashed, the gate's pool through a fault proxy.
    pub async fn cluster(connections: u32) -> Target {
        let cluster = tokio::task::spawn_blocking(Cluster::start)
            .await
            .expect("start a throwaway cluster");
        let proxy = Arc::new(Proxy::in_front_of(cluster.options()).await);
        let direct = cluster.options();
        Target::through(proxy, direct, Some(Arc::new(cluster)), connections).await
    }

    async fn through(
        proxy: Arc<Proxy>,
        direct: PgConnectOptions,
        cluster: Option<Arc<Cluster>>,
        connections: u32,
    ) -> Target {
        let application_name = testing::unique_name("history");
        // Every statement's text in a Parse message, for the proxy to see.
        let options = proxy
            .options()
            .application_name(&application_name)
            .statement_cache_capacity(0);
        Target::on(
            options,
            direct,
            application_name,
            Some(proxy),
            cluster,
            connections,
        )
        .await
    }

    async fn on(
        gate_options: PgConnectOptions,
        direct: PgConnectOptions,
        application_name: String,
        proxy: Option<Arc<Proxy>>,
        cluster: Option<Arc<Cluster>>,
        connections: u32,
    ) -> Target {
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            // Long enough to ride out a restart; an outage is what the
            // faults are for, not a pool too small for its callers.
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(gate_options)
            .await
            .expect("connect the gate's pool");
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(direct)
            .await
            .expect("connect the admin pool");
        let gate = testing::gate_on(pool).await;
        create_effects_table(&admin).await;
        Target {
            gate,
            admin,
            application_name,
            proxy,
            cluster,
            cached: None,
        }
    }

    /// This target, with `cached` (the gate with a cache) beside its gate.
    /// The caller makes it, as only it knows the feature `cache`.
    pub fn beside(mut self, cached: Gate) -> Target {
        self.cached = Some(cached);
        self
    }

    /// A gate as another process has one, in `gate`'s account: a pool of
    /// its own with the same options (the same proxy and application
    /// name, so that the faults reach it too), and so its own registry of
    /// claims in flight and its own wake-up listener. Its waiters on
    /// `gate`'s claims, and `gate`'s on its, are woken across processes.
    pub async fn elsewhere(&self) -> Gate {
        let pool = self.gate.pool();
        let pool = PgPoolOptions::new()
            .max_connections(pool.options().get_max_connections())
            .acquire_timeout(Duration::from_secs(10))
            .connect_with((*pool.connect_options()).clone())
            .await
            .expect("connect another process's pool");
        Gate::connect(pool)
            .await
            .expect("another process's gate starts")
            .account(self.gate.account_name())
    }
}

fn database_options() -> PgConnectOptions {
    let url = testing::database_url();
    url.parse()
        .unwrap_or_else(|e| panic!("DATABASE_URL={url} is not a PostgreSQL URL: {e}"))
}
